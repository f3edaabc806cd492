//! Process creation and process-wide settings.

use crate::{Result, SysError};
use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;

/// Whether a spawned program may be given transparent huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    /// As the host's settings say.
    Allowed,
    /// Never (`PR_SET_THP_DISABLE`, kept across `execve`): every page the program touches is
    /// a base page. For VMMs whose guest RAM is filled from a file at restore: with huge pages
    /// each first touch of a 2 MiB range zeroes all of it, however little is then written.
    Off,
}

/// Spawns `program` with `argv`/`envp`. Each `(src, dst)` in `fds` is duplicated onto `dst`
/// in the child; every other close-on-exec fd stays closed. The child starts in a new session
/// with every signal at its default and none blocked. With [`HugePages::Allowed`] this is a
/// `posix_spawn` (a vfork-style clone, cheap even from a large multi-threaded daemon); with
/// [`HugePages::Off`] a fork, since the setting must be made in the child before `execve`.
pub fn spawn_with_fds(
    program: &str,
    argv: &[String],
    envp: &[String],
    fds: &[(RawFd, RawFd)],
    huge_pages: HugePages,
) -> Result<u32> {
    if huge_pages == HugePages::Off {
        return fork_exec_without_thp(program, argv, envp, fds);
    }
    let to_c = |s: &str| {
        CString::new(s)
            .map_err(|_| SysError::new("spawn", std::io::Error::other("NUL in argument")))
    };
    let prog = to_c(program)?;
    let argv_c: Vec<CString> = argv.iter().map(|s| to_c(s)).collect::<Result<_>>()?;
    let envp_c: Vec<CString> = envp.iter().map(|s| to_c(s)).collect::<Result<_>>()?;
    let mut argv_p: Vec<*mut libc::c_char> = argv_c.iter().map(|s| s.as_ptr() as *mut _).collect();
    argv_p.push(std::ptr::null_mut());
    let mut envp_p: Vec<*mut libc::c_char> = envp_c.iter().map(|s| s.as_ptr() as *mut _).collect();
    envp_p.push(std::ptr::null_mut());

    // SAFETY: the file-actions and attr objects are initialised before use and destroyed on
    // every path; all pointers passed to posix_spawn point into CStrings that outlive the call.
    unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        if libc::posix_spawn_file_actions_init(&mut fa) != 0 {
            return Err(SysError::last("posix_spawn_file_actions_init"));
        }
        if libc::posix_spawnattr_init(&mut attr) != 0 {
            libc::posix_spawn_file_actions_destroy(&mut fa);
            return Err(SysError::last("posix_spawnattr_init"));
        }
        let mut rc = 0;
        for (src, dst) in fds {
            if rc == 0 {
                rc = libc::posix_spawn_file_actions_adddup2(&mut fa, *src, *dst);
            }
        }
        if rc == 0 {
            rc = libc::posix_spawnattr_setflags(
                &mut attr,
                (libc::POSIX_SPAWN_SETSID as i32
                    | libc::POSIX_SPAWN_SETSIGMASK
                    | libc::POSIX_SPAWN_SETSIGDEF) as _,
            );
        }
        if rc == 0 {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            rc = libc::posix_spawnattr_setsigmask(&mut attr, &empty);
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            if rc == 0 {
                rc = libc::posix_spawnattr_setsigdefault(&mut attr, &all);
            }
        }
        let mut pid: libc::pid_t = 0;
        if rc == 0 {
            rc = libc::posix_spawn(
                &mut pid,
                prog.as_ptr(),
                &fa,
                &attr,
                argv_p.as_ptr(),
                envp_p.as_ptr(),
            );
        }
        libc::posix_spawn_file_actions_destroy(&mut fa);
        libc::posix_spawnattr_destroy(&mut attr);
        if rc != 0 {
            return Err(SysError::new(
                format!("spawn {program}"),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(pid as u32)
    }
}

/// [`spawn_with_fds`] with [`HugePages::Off`]: a `std` command whose pre-exec hook makes the
/// same child set-up as the `posix_spawn` path, then turns transparent huge pages off.
fn fork_exec_without_thp(
    program: &str,
    argv: &[String],
    envp: &[String],
    fds: &[(RawFd, RawFd)],
) -> Result<u32> {
    let mut cmd = std::process::Command::new(program);
    if let Some((first, rest)) = argv.split_first() {
        cmd.arg0(first).args(rest);
    }
    cmd.env_clear();
    for e in envp {
        match e.split_once('=') {
            Some((k, v)) => cmd.env(k, v),
            None => cmd.env(e, ""),
        };
    }
    // A program that cannot be run is refused here, not by a failed `execve` (see
    // `check_runnable`: the daemon's reaper may collect the child first).
    crate::children::check_runnable(&cmd)
        .map_err(|e| SysError::new(format!("spawn {program}"), e))?;
    let fds = fds.to_vec();
    // SAFETY: between fork and exec the hook makes only async-signal-safe system calls
    // (dup2, fcntl, signal, setsid, prctl; `SIGRTMAX` reads a constant of the C library) on
    // values copied before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for &(src, dst) in &fds {
                if src == dst {
                    // Already in place: only its close-on-exec flag goes.
                    let flags = libc::fcntl(src, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(src, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(src, dst) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for sig in 1..libc::SIGRTMAX() {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Best effort: a kernel without it (before 3.15) keeps the host's settings.
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| SysError::new(format!("spawn {program}"), e))?;
    // The caller waits for the pid (the daemon's reaper); `Child` neither waits nor kills on
    // drop.
    Ok(child.id())
}

/// Result of [`fork`].
#[derive(Debug)]
pub enum Forked {
    Parent { child: u32 },
    Child,
}

/// Forks the calling process.
///
/// # Safety
/// The calling process must be single-threaded (the agent during start-up): after `fork` in
/// a multi-threaded process the child may only make async-signal-safe calls, since another
/// thread may have held a lock (the allocator's, stdio's) at the moment of the fork.
pub unsafe fn fork_single_threaded() -> Result<Forked> {
    // SAFETY: the caller guarantees the process is single-threaded (this function's
    // contract), so the child inherits no lock held by another thread.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok(Forked::Parent {
            child: child.as_raw() as u32,
        }),
        Ok(nix::unistd::ForkResult::Child) => Ok(Forked::Child),
        Err(e) => Err(SysError::errno("fork", e)),
    }
}

/// Gives the allocator's free memory back to the kernel: glibc keeps what a burst of work freed
/// (thousands of sandboxes created and deleted, large exports) in its arenas until asked.
/// Returns whether any memory was released; does nothing on other C libraries.
#[cfg(target_env = "gnu")]
pub fn trim_heap() -> bool {
    // SAFETY: malloc_trim(0) takes no pointers; it walks and shrinks glibc's own arenas under
    // their locks and may be called from any thread at any time.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Caps glibc's malloc arenas at `n` unless `MALLOC_ARENA_MAX` says otherwise. glibc gives each
/// thread that allocates under contention an arena of its own, up to 8 per CPU, and every arena
/// keeps the fragments of what it once served: after thousands of sandboxes came and went, a
/// trimmed daemon still held about 3 MiB in each of 14 arenas on a 2-CPU host. Call before any
/// other thread starts. Returns whether the cap was set.
#[cfg(target_env = "gnu")]
pub fn limit_malloc_arenas(n: usize) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    let n = n.clamp(1, i32::MAX as usize) as libc::c_int;
    // SAFETY: mallopt takes two integers and changes glibc's own settings under its lock.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
}

/// Caps the allocator's arenas (only glibc has them).
#[cfg(not(target_env = "gnu"))]
pub fn limit_malloc_arenas(_n: usize) -> bool {
    false
}

/// Gives the allocator's free memory back to the kernel (only glibc needs to be asked).
#[cfg(not(target_env = "gnu"))]
pub fn trim_heap() -> bool {
    false
}

/// How many threads the calling process has (`num_threads` of /proc/self/stat).
pub fn thread_count() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .map_err(|e| SysError::new("read /proc/self/stat", e))?;
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(17))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            SysError::new(
                "read /proc/self/stat",
                std::io::Error::new(std::io::ErrorKind::InvalidData, "no thread count"),
            )
        })
}

/// Fails unless the calling process has exactly one thread. Only this thread could start
/// another, so the answer holds until it does.
pub(crate) fn check_single_threaded(what: &str) -> Result<()> {
    match thread_count()? {
        1 => Ok(()),
        n => Err(SysError::new(
            what,
            std::io::Error::other(format!(
                "needs a single-threaded process; this one has {n} threads"
            )),
        )),
    }
}

/// [`fork_single_threaded`] after checking its precondition: fails in a process with more
/// than one thread.
pub fn fork_checked() -> Result<Forked> {
    check_single_threaded("fork")?;
    // SAFETY: the process has one thread (checked just above), and only this thread could
    // start another before the fork.
    unsafe { fork_single_threaded() }
}

/// Makes this process a child subreaper: orphaned descendants are re-parented to it.
pub fn set_child_subreaper() -> Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| SysError::errno("PR_SET_CHILD_SUBREAPER", e))
}

/// Marks the process non-dumpable: no ptrace attach, no /proc/PID/{fd,mem,environ} for others.
pub fn set_non_dumpable() -> Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| SysError::errno("PR_SET_DUMPABLE", e))
}

/// Sets `no_new_privs`: exec can never grant privileges (setuid bits, file caps).
pub fn set_no_new_privs() -> Result<()> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| SysError::errno("PR_SET_NO_NEW_PRIVS", e))
}

/// What a command's child process does between fork and exec.
#[derive(Debug, Clone, Default)]
pub struct ChildSetup {
    /// Start a new session (and process group) so the whole tree can be signalled.
    pub new_session: bool,
    /// Make fd 0 the controlling terminal (after `new_session`).
    pub controlling_tty: bool,
    /// Switch to these ids (supplementary groups first, then gid, then uid).
    pub ids: Option<(u32, u32, Vec<u32>)>,
    /// Run under `SCHED_IDLE`, with a hard `RLIMIT_NICE` of 0 so the process cannot switch
    /// back to an ordinary policy (that needs the limit or CAP_SYS_NICE of the host).
    pub sched_idle: bool,
    /// Confine the program under this AppArmor profile from its exec on.
    pub apparmor_profile: Option<std::ffi::CString>,
    /// CPUs the child may run on again once it runs (see [`PlaceOnThisCpu`]).
    pub affinity: Option<nix::sched::CpuSet>,
    /// Give the child the kernel's default time slice again (the parent's short one, see
    /// [`set_time_slice`], is inherited across fork).
    pub default_time_slice: Option<TimeSlice>,
    /// `cgroup.procs` files (open for writing) the child moves itself into before anything
    /// else: the sandbox's leaf group of commands. A move that fails fails the start.
    pub join_cgroups: Vec<std::os::fd::RawFd>,
}

/// The shortest time slice the kernel grants an ordinary task (0.1 ms).
pub const SHORT_TIME_SLICE_NS: u64 = 100_000;

/// A scheduling request for an ordinary task: its policy and nice value kept, its time slice
/// set (EEVDF's custom slice, Linux 6.12 and later; older kernels ignore it).
#[derive(Clone, Copy)]
pub struct TimeSlice {
    attr: libc::sched_attr,
}

impl std::fmt::Debug for TimeSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimeSlice")
            .field("ns", &self.attr.sched_runtime)
            .finish()
    }
}

impl TimeSlice {
    /// The request for `ns` nanoseconds (0: the kernel's default) for the calling thread as
    /// it is now; `None` when it is not an ordinary task (`SCHED_IDLE`, realtime) or its
    /// policy cannot be read.
    pub fn for_current(ns: u64) -> Option<TimeSlice> {
        // SAFETY: sched_getscheduler(2) and getpriority(2) take integers and touch no memory.
        // The system call itself: musl's wrapper answers ENOSYS (POSIX means the process,
        // Linux the thread).
        let (policy, nice) = unsafe {
            *libc::__errno_location() = 0;
            let policy = libc::syscall(libc::SYS_sched_getscheduler, 0) as libc::c_int;
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            (policy, nice)
        };
        if policy != libc::SCHED_OTHER && policy != libc::SCHED_BATCH {
            return None;
        }
        // SAFETY: sched_attr is plain integers; all-zero is a valid value.
        let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
        attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
        attr.sched_policy = policy as u32;
        attr.sched_nice = nice;
        attr.sched_runtime = ns;
        Some(TimeSlice { attr })
    }

    /// Applies it to the calling thread. Async-signal-safe (one syscall).
    pub fn apply(&self) -> bool {
        self.apply_to(0)
    }

    /// Applies it to the thread `tid` (0: the calling one). Async-signal-safe (one syscall).
    pub fn apply_to(&self, tid: u32) -> bool {
        // SAFETY: sched_setattr(2) reads `attr.size` bytes from a valid, initialized struct.
        unsafe {
            libc::syscall(
                libc::SYS_sched_setattr,
                tid as libc::pid_t,
                &self.attr as *const _,
                0,
            ) == 0
        }
    }
}

/// Gives the calling thread a time slice of `ns` (see [`TimeSlice`]); the threads and
/// processes it starts later inherit it. A short slice lets a waking task preempt a CPU hog
/// at once instead of at the end of the hog's slice; the share of CPU time stays that of the
/// task's weight. False when the request was not applied.
pub fn set_time_slice(ns: u64) -> bool {
    TimeSlice::for_current(ns).is_some_and(|t| t.apply())
}

/// Makes the next child start on the CPU the caller runs on: the caller's CPU mask is
/// narrowed to that CPU for the fork (the child inherits it) and restored when this is
/// dropped; the child widens its own mask back in its pre-exec hook
/// ([`ChildSetup::affinity`]).
///
/// Why: a new task is placed by the kernel's fork balancing, which picks the idlest CPU and
/// counts one running only `SCHED_IDLE` or busy neighbours' tasks as a candidate; on hosts
/// where waking a new task there waits for the next scheduler tick, every command waits up to
/// a tick (4 ms at 250 Hz) while a neighbour floods the CPU. The parent is about to sleep
/// (it waits for the command), so its own CPU is the one that frees first, with its caches
/// warm. The load balancer still moves a long command elsewhere: only the start is placed.
pub struct PlaceOnThisCpu {
    saved: nix::sched::CpuSet,
}

impl PlaceOnThisCpu {
    /// Narrows the caller's mask to its current CPU; `None` (nothing changed) when the CPU
    /// or the mask cannot be read or set, e.g. under a seccomp filter that refuses it.
    pub fn new() -> Option<PlaceOnThisCpu> {
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        use nix::unistd::Pid;
        let saved = sched_getaffinity(Pid::from_raw(0)).ok()?;
        // SAFETY: sched_getcpu(3) takes no arguments and touches no memory of ours.
        let cpu = unsafe { libc::sched_getcpu() };
        let cpu = usize::try_from(cpu).ok()?;
        if !saved.is_set(cpu).ok()? {
            return None;
        }
        let mut one = CpuSet::new();
        one.set(cpu).ok()?;
        sched_setaffinity(Pid::from_raw(0), &one).ok()?;
        Some(PlaceOnThisCpu { saved })
    }

    /// The mask the child restores.
    pub fn saved(&self) -> nix::sched::CpuSet {
        self.saved
    }

    /// Gives the started child `pid` the saved mask, for a child started without a pre-exec
    /// hook (it runs on this CPU alone until then). Best effort: a child that already exited
    /// has no mask to widen.
    pub fn widen(&self, pid: u32) {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &self.saved);
    }
}

impl Drop for PlaceOnThisCpu {
    fn drop(&mut self) {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &self.saved);
    }
}

/// Makes the running process `pid` the OOM killer's first choice (`oom_score_adj` 1000). The
/// pre-exec hook tries the same, but a child of a non-dumpable parent cannot write its own
/// `/proc/self` files until it has exec'd; after `spawn` returned it has, so the parent can.
/// Best effort: a process that already exited has nothing to adjust.
pub fn make_oom_victim(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "1000");
}

/// Installs `setup` as the command's pre-exec hook.
pub fn configure_child(cmd: &mut std::process::Command, setup: ChildSetup) {
    let groups: Vec<libc::gid_t> = setup
        .ids
        .as_ref()
        .map(|(_, _, g)| g.clone())
        .unwrap_or_default();
    let apparmor_exec = setup.apparmor_profile.as_ref().map(|p| {
        let mut v = b"exec ".to_vec();
        v.extend_from_slice(p.as_bytes());
        v
    });
    // SAFETY: the closure only makes async-signal-safe syscalls (open, write, close,
    // sched_setattr, sched_setaffinity, setrlimit, sched_setscheduler, setsid, ioctl, setgroups, setresgid, setresuid) and
    // allocates nothing (the group list, the AppArmor request and the paths are prepared
    // before fork).
    unsafe {
        cmd.pre_exec(move || {
            // Into the commands' group first: what the child allocates from here on is
            // charged there.
            for fd in &setup.join_cgroups {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Commands are the OOM killer's first choice, never the agent: raising a score
            // needs no privilege (hosts where the daemon cannot lower the agent's keep this),
            // and a command cannot go below the agent's score again.
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            if let Some(slice) = &setup.default_time_slice {
                slice.apply();
            }
            if let Some(mask) = &setup.affinity {
                // Best effort: a child left on one CPU still runs, only less spread.
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), mask);
            }
            if setup.sched_idle {
                let rl = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::setrlimit(libc::RLIMIT_NICE, &rl) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Zeroed, not a literal: musl's `sched_param` has more fields than glibc's.
                let mut param: libc::sched_param = std::mem::zeroed();
                param.sched_priority = 0;
                // The system call itself: musl's `sched_setscheduler` answers ENOSYS.
                if libc::syscall(
                    libc::SYS_sched_setscheduler,
                    0,
                    libc::SCHED_IDLE,
                    &param as *const libc::sched_param,
                ) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(req) = &apparmor_exec {
                // AppArmor's "change_onexec": the new profile applies at execve.
                let mut fd = libc::open(
                    c"/proc/self/attr/apparmor/exec".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    fd = libc::open(
                        c"/proc/self/attr/exec".as_ptr(),
                        libc::O_WRONLY | libc::O_CLOEXEC,
                    );
                }
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let bytes = req.as_slice();
                let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                libc::close(fd);
                if n < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if setup.new_session && libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if setup.controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid, _)) = &setup.ids {
                if libc::setgroups(groups.len(), groups.as_ptr()) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setresgid(*gid, *gid, *gid) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setresuid(*uid, *uid, *uid) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Sends `signal` to every process of the process group `pgid`.
pub fn kill_group(pgid: u32, signal: i32) -> Result<()> {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    let r = unsafe { libc::kill(-(pgid as i32), signal) };
    if r < 0 {
        return Err(SysError::last(format!("kill(-{pgid}, {signal})")));
    }
    Ok(())
}

/// Sends `signal` to one process.
pub fn kill(pid: u32, signal: i32) -> Result<()> {
    // SAFETY: kill(2) takes plain integers.
    let r = unsafe { libc::kill(pid as i32, signal) };
    if r < 0 {
        return Err(SysError::last(format!("kill({pid}, {signal})")));
    }
    Ok(())
}

/// Sets the process's user and group ids (all of real/effective/saved) and clears
/// supplementary groups.
pub fn become_user(uid: u32, gid: u32) -> Result<()> {
    nix::unistd::setgroups(&[]).map_err(|e| SysError::errno("setgroups", e))?;
    nix::unistd::setresgid(gid.into(), gid.into(), gid.into())
        .map_err(|e| SysError::errno("setresgid", e))?;
    nix::unistd::setresuid(uid.into(), uid.into(), uid.into())
        .map_err(|e| SysError::errno("setresuid", e))?;
    Ok(())
}

/// `MADV_PAGEOUT`: reclaim the pages now (to swap for anonymous memory).
pub const MADV_PAGEOUT: i32 = 21;

/// `process_madvise(2)` over `ranges` (start, length) of the process behind `pidfd`.
/// Returns the number of bytes advised. Needs CAP_SYS_NICE and ptrace-read rights.
pub fn process_madvise(
    pidfd: &std::os::fd::OwnedFd,
    ranges: &[(usize, usize)],
    advice: i32,
) -> Result<usize> {
    use std::os::fd::AsRawFd;
    let iov: Vec<libc::iovec> = ranges
        .iter()
        .map(|(start, len)| libc::iovec {
            iov_base: *start as *mut libc::c_void,
            iov_len: *len,
        })
        .collect();
    let mut total = 0usize;
    // The kernel takes at most UIO_MAXIOV (1024) vectors per call.
    for chunk in iov.chunks(1024) {
        // SAFETY: the iovecs describe address ranges of *another* process; the kernel reads
        // only the iovec array, which lives across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                chunk.as_ptr(),
                chunk.len(),
                advice,
                0u32,
            )
        };
        if r < 0 {
            return Err(SysError::last("process_madvise"));
        }
        total += r as usize;
    }
    Ok(total)
}

/// `kill(-1, signal)`: every process this one may signal. Called by PID 1 of a pid
/// namespace it reaches every other process of that namespace (and nothing outside it).
pub fn kill_everyone_else(signal: i32) -> Result<()> {
    // SAFETY: kill(2) takes plain integers.
    let r = unsafe { libc::kill(-1, signal) };
    if r < 0 {
        return Err(SysError::last(format!("kill(-1, {signal})")));
    }
    Ok(())
}

#[cfg(test)]
mod single_thread_tests {
    #[test]
    fn forks_are_refused_in_a_process_with_threads() {
        // The test harness runs this test on a thread of its own: more than one thread.
        let _other = std::thread::spawn(std::thread::park);
        assert!(super::thread_count().unwrap() > 1);
        let e = super::fork_checked().unwrap_err();
        assert!(e.to_string().contains("single-threaded"), "{e}");
        let e = crate::clone::clone_checked(nix::sched::CloneFlags::empty()).unwrap_err();
        assert!(e.to_string().contains("single-threaded"), "{e}");
    }
}

#[cfg(test)]
mod placement_tests {
    use super::*;
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;

    fn count(m: &CpuSet) -> usize {
        (0..CpuSet::count())
            .filter(|&c| m.is_set(c).unwrap())
            .count()
    }

    fn cpus() -> usize {
        count(&sched_getaffinity(Pid::from_raw(0)).unwrap())
    }

    #[test]
    fn a_placement_narrows_to_one_cpu_and_gives_the_mask_back() {
        let before = cpus();
        {
            let place = PlaceOnThisCpu::new().expect("the mask can be read and set");
            assert_eq!(cpus(), 1);
            assert_eq!(count(&place.saved()), before);
        }
        assert_eq!(cpus(), before);
    }

    #[test]
    fn a_child_gets_the_mask_and_the_default_slice_back() {
        // On a thread of its own: the slice is per thread, and the harness's other tests
        // must keep theirs.
        std::thread::spawn(|| {
            let has_slice = std::fs::read_to_string("/proc/thread-self/sched")
                .is_ok_and(|s| s.contains("se.slice"));
            assert!(set_time_slice(SHORT_TIME_SLICE_NS));
            let place = PlaceOnThisCpu::new().unwrap();
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.args(["-c", "grep -E '^(Cpus_allowed_list)' /proc/self/status; grep se.slice /proc/self/sched || true"]);
            configure_child(
                &mut cmd,
                ChildSetup {
                    affinity: Some(place.saved()),
                    default_time_slice: TimeSlice::for_current(0),
                    ..Default::default()
                },
            );
            let out = cmd.output().unwrap();
            drop(place);
            let out = String::from_utf8(out.stdout).unwrap();
            let allowed = out.lines().next().unwrap();
            let ours = std::fs::read_to_string("/proc/self/status").unwrap();
            assert!(ours.lines().any(|l| l == allowed), "child: {out}");
            if has_slice {
                let slice = out
                    .lines()
                    .find(|l| l.starts_with("se.slice"))
                    .and_then(|l| l.split_whitespace().last())
                    .and_then(|v| v.parse::<u64>().ok());
                assert!(slice.is_some_and(|s| s != SHORT_TIME_SLICE_NS), "child: {out}");
            }
        })
        .join()
        .unwrap();
    }
}

#[cfg(test)]
mod spawn_tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Runs `sh -c script` through [`spawn_with_fds`] with its stdout in a file; its output.
    fn run(script: &str, huge_pages: HugePages) -> String {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("warren-spawn-{}-{n}", std::process::id()));
        let out = std::fs::File::create(&path).unwrap();
        let pid = spawn_with_fds(
            "/bin/sh",
            &["sh".into(), "-c".into(), script.into()],
            &["PATH=/usr/bin:/bin".into()],
            &[(out.as_raw_fd(), 1)],
            huge_pages,
        )
        .unwrap();
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None).unwrap();
        assert!(
            matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
            "{status:?}"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        text
    }

    #[test]
    fn a_program_spawned_without_huge_pages_keeps_the_rest_of_its_set_up() {
        let script = "grep -E '^THP_enabled' /proc/self/status; \
                      set -- $(cat /proc/$$/stat); [ \"$6\" = \"$$\" ] && echo session; \
                      echo \"$PATH\"";
        let off = run(script, HugePages::Off);
        assert_eq!(off, "THP_enabled:\t0\nsession\n/usr/bin:/bin\n");
        // The same set-up through posix_spawn, where huge pages stay as the host says.
        let allowed = run(script, HugePages::Allowed);
        assert_eq!(allowed, "THP_enabled:\t1\nsession\n/usr/bin:/bin\n");
        // A program that is not there is an error, not a child.
        let e = spawn_with_fds(
            "/nonexistent/qemu",
            &["qemu".into()],
            &[],
            &[],
            HugePages::Off,
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/qemu"), "{e}");
    }
}
