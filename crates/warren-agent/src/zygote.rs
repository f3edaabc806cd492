//! The Python zygote of a function container: one interpreter started per container, which
//! forks each call's interpreter instead of starting a new one in every cell.
//!
//! Starting Python costs ≈ 7 ms of CPU per call (exec, dynamic linking, the interpreter's
//! start, `site`, the page faults of all of it), a fork of one already started ≈ 1.8 ms
//! (docs/performance.md). A warm interpreter per cell hid the start from latency, not from
//! the CPU; the zygote takes it off the CPU too.
//!
//! Who does what (nothing of the cell's isolation moves into Python but the last steps a
//! process can only take on itself):
//!
//! - The agent starts the zygote ([`main`]): in its own mount, ipc and uts namespaces (the
//!   agent's pid namespace), on a root staged exactly as a cell's and then made read-only, running
//!   `python3 -c ZYGOTE` with the agent's socket on fd 3. The zygote keeps the agent's
//!   capabilities and the *builder* half of the seccomp policy (which lets it enter a cell's
//!   namespaces: `setns` is cell building, refused again by the finish half); it never runs
//!   a call's code.
//! - For each cell the agent makes a `SOCK_SEQPACKET` pair, keeps one end for the cell (fd
//!   [`ZYGOTE_FD`]) and hands the other to the zygote, which adds it to its one poll loop
//!   (a slow or dead cell never holds the zygote).
//! - The cell builds its root, drops its capabilities and installs the finish filter as
//!   always, then sends its request ([`request`]): its own namespaces (`/proc/self/ns/*`), the
//!   pipes of the call's stdin, stdout and stderr, its Landlock ruleset, the capabilities to
//!   keep and the finish filter's program.
//! - The zygote enters the cell's uts, ipc, pid and mount namespaces (`setns`), forks the
//!   call's process, which is in the cell's pid namespace and root, and goes back into its
//!   own namespaces (a `setns` back it cannot make ends it: the agent starts another). The
//!   call's process puts the pipes on 0, 1 and 2 and the cell's socket on [`STATUS_FD`],
//!   closes every other descriptor, makes itself the OOM killer's first choice, drops the
//!   same capabilities as the cell (bounding — the zygote gave up all but the cell's at its
//!   start, so there is usually nothing left to drop —, ambient, inheritable, effective,
//!   permitted),
//!   sets `no_new_privs`, becomes non-dumpable, enforces the cell's Landlock ruleset and
//!   installs the finish filter — the order the cell takes them in — and only then says it
//!   is warm (`R`) and waits for its call like the cell's own warm interpreter. Any step
//!   that fails ends it before `R`: the cell then starts its own interpreter (the path
//!   without a zygote).
//! - The call's exit reaches the cell on its socket ([`exit_of`]): the bootstrap reports the
//!   program's exit code as it exits (in the call's own process only: a child the program
//!   forked ends through the same code); the zygote, which waits for its calls' processes
//!   (one pidfd each in its poll loop), sends the wait status of one that ended otherwise
//!   (a signal, `os._exit`, an `exec`). The cell kills what the call left (`kill(-1)` as its
//!   pid namespace's PID 1) and ends as always. The call's process is a copy of the zygote:
//!   nothing of one call reaches the next.
//! - One fork per call: an earlier design forked a *carrier* per cell from the zygote, which
//!   entered the cell's namespaces and forked the call's process from there — a second copy
//!   of the interpreter per call, ≈ 1.3 ms of CPU (docs/performance.md).
//!
//! The agent restarts a zygote that died (up to [`MAX_STARTS`] times per container, so a
//! preload that cannot be imported does not restart it forever); a cell that gets no warm
//! interpreter from it starts its own. A call's process that outlives its zygote (the agent,
//! PID 1 of the container, becomes its parent and reaps it) still reports its exit code
//! itself; one killed then is reported killed.
//!
//! What differs from an interpreter started per call: every call's interpreter shares the
//! zygote's address layout and string hash seed, and has the modules the zygote imported
//! (`ctypes`, `_socket` and the pool's preload) already loaded. The zygote runs the image's
//! start-up code (`site`, `.pth` files, the preload) with the container's privileges, once,
//! before any call: it trusts the pool's image as the pool's calls do.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use warren_proto::ContainerInit;

/// Where a cell finds its end of the zygote's socket (when its agent has a zygote).
pub const ZYGOTE_FD: i32 = warren_proto::CONTROL_FD + 1;

/// Most zygotes one container starts.
pub const MAX_STARTS: u32 = 5;

/// The zygote's Python (see the module doc). `_warren_main` and `_warren_fields` are the warm
/// bootstrap's (`warm::PY_DEFS`). Numbers are Linux's: `prctl` options, `setns` types,
/// `landlock_restrict_self` (446 on every architecture), `_LINUX_CAPABILITY_VERSION_3`.
const ZYGOTE_PY: &str = r#"
import os, sys
__PRELOAD__
__DEFS__
def _warren_zygote(os, sys, main, fields):
    import _socket, ctypes, gc, select
    libc = ctypes.CDLL(None, use_errno=True)
    ul = ctypes.c_ulong
    # Typed once: a call passes plain ints (no ctypes object made per argument).
    libc.prctl.argtypes = (ctypes.c_int, ul, ul, ul, ul)
    libc.prctl.restype = ctypes.c_int
    def prctl(op, a=0, b=0):
        return libc.prctl(op, a, b, 0, 0)
    # The bounding set a call's process inherits: only what it holds is dropped (every
    # number up to 63 when it cannot be read; the ones past the kernel's last are refused).
    bounding = (1 << 64) - 1
    try:
        with open("/proc/self/status") as st:
            for line in st:
                if line.startswith("CapBnd:"):
                    bounding = int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    # The calls keep at most the cell's capabilities (`__KEEP__`): the zygote gives up the
    # rest of its bounding set once (it never execs: its own effective capabilities, which
    # enter the cells' namespaces, stay), so its forks inherit it and drop nothing per call.
    for cap in range(64):
        if bounding >> cap & 1 and not __KEEP__ >> cap & 1 and prctl(24, cap) == 0:
            bounding &= ~(1 << cap)
    U, SEQ = _socket.AF_UNIX, _socket.SOCK_SEQPACKET
    SOL, RIGHTS = _socket.SOL_SOCKET, _socket.SCM_RIGHTS
    order = sys.byteorder
    # setns types: mnt, pid, ipc, uts; entered in the reverse order, left in this one.
    NS = ((0, "mnt", 0x20000), (1, "pid", 0x20000000), (2, "ipc", 0x08000000), (3, "uts", 0x04000000))
    own = [(os.open("/proc/self/ns/" + n, os.O_RDONLY | os.O_CLOEXEC), t) for _, n, t in NS]
    # Every ctypes type a call's process uses is made here, once: a type made after the fork
    # (`c_uint32 * 2` is a new class) costs each call the making of a class.
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    CapHeader, CapData = ctypes.c_uint32 * 2, ctypes.c_uint32 * 6
    filters = {}
    def filter_of(prog):
        # The finish filter's `sock_fprog`, made in the zygote for each program it was sent.
        f = filters.get(prog)
        if f is None:
            if len(filters) >= 4:
                filters.clear()
            buf = ctypes.create_string_buffer(prog, len(prog))
            f = filters[prog] = (buf, Prog(len(prog) // 8, ctypes.addressof(buf)))
        return f
    def recv(s):
        msg, anc, _, _ = s.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * 16))
        fds = []
        for lvl, typ, d in anc:
            if lvl == SOL and typ == RIGHTS:
                fds += [int.from_bytes(d[i:i + 4], order) for i in range(0, len(d) - 3, 4)]
        return msg, fds
    def call(fds, msg, status, fprog):
        # The call's process, in the cell's namespaces: restricted as the cell is, then warm.
        # A session of its own first: in the zygote's process group, `os.kill(0, 9)` killed
        # the zygote and every call it forked wherever Landlock cannot scope signals.
        os.setsid()
        os.dup2(fds[4], 0)
        os.dup2(fds[5], 1)
        os.dup2(fds[6], 2)
        top = 2
        if len(fds) > 7:
            os.dup2(fds[7], 3)
            top = 3
        if status != __STATUS_FD__:
            os.dup2(status, __STATUS_FD__, inheritable=False)
        os.set_inheritable(__STATUS_FD__, False)
        # close_range(2) where the kernel has it (Python falls back to closing one by one).
        os.closerange(top + 1, __STATUS_FD__)
        os.closerange(__STATUS_FD__ + 1, 1 << 20)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
        keep = int.from_bytes(msg[2:10], "little")
        drop = bounding & ~keep
        for cap in range(64):
            if drop >> cap & 1 and prctl(24, cap) != 0 and ctypes.get_errno() != 22:
                os._exit(103)
        if prctl(47, 4) != 0:
            os._exit(104)
        lo, hi = keep & 0xFFFFFFFF, keep >> 32
        hdr = CapHeader(0x20080522, 0)
        data = CapData(lo, lo, 0, hi, hi, 0)
        if libc.capset(hdr, data) != 0:
            os._exit(105)
        if prctl(38, 1) != 0 or prctl(4, 0) != 0:
            os._exit(106)
        if top == 3:
            if libc.syscall(ctypes.c_long(446), ctypes.c_int(3), ctypes.c_uint32(0)) != 0:
                os._exit(107)
            os.close(3)
        if fprog is not None and prctl(22, 2, ctypes.addressof(fprog[1])) != 0:
            os._exit(108)
        os.write(1, b"R")
        main(os, sys, fields, __STATUS_FD__)
    def fork_for(s):
        # A cell's request: enter its namespaces, fork its call's process, come back.
        try:
            msg, fds = recv(s)
        except OSError:
            msg, fds = b"", []
        pid = 0
        if len(fds) >= 7 and msg[:2] == b"W1":
            fprog = filter_of(msg[10:]) if msg[10:] else None
            try:
                for i, _, t in reversed(NS):
                    if libc.setns(fds[i], t) != 0:
                        raise OSError
                pid = os.fork()
            except OSError:
                pid = 0
            else:
                if pid == 0:
                    try:
                        call(fds, msg, s.fileno(), fprog)
                    finally:
                        os._exit(110)
            for f, t in own:
                if libc.setns(f, t) != 0:
                    os._exit(109)
            os.chdir("/")
        for f in fds:
            os.close(f)
        if pid:
            try:
                return os.pidfd_open(pid), pid, s
            except OSError:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        s.close()
    ctl = _socket.socket(U, SEQ, 0, 3)
    cells, calls = {}, {}
    poll = select.poll()
    poll.register(3, select.POLLIN)
    # The builtin `compile`, which runs every call's program, makes the interpreter's ~120
    # `ast` node classes the first time it is used: made here once, not in every call.
    compile("pass", "<zygote>", "exec")
    # What the zygote has made so far is never collected by a call's process: its collector
    # does not write (and so copy) the zygote's pages.
    gc.freeze()
    while True:
        try:
            ready = poll.poll()
        except InterruptedError:
            continue
        for fd, _ in ready:
            if fd == 3:
                try:
                    msg, fds = recv(ctl)
                except InterruptedError:
                    continue
                if not msg:
                    os._exit(0)
                for f in fds:
                    cells[f] = _socket.socket(U, SEQ, 0, f)
                    poll.register(f, select.POLLIN)
            elif fd in cells:
                poll.unregister(fd)
                c = fork_for(cells.pop(fd))
                if c:
                    calls[c[0]] = c
                    poll.register(c[0], select.POLLIN)
            elif fd in calls:
                poll.unregister(fd)
                _, pid, s = calls.pop(fd)
                os.close(fd)
                try:
                    _, st = os.waitpid(pid, 0)
                except ChildProcessError:
                    st = 9
                try:
                    s.send(st.to_bytes(4, order))
                except OSError:
                    pass
                s.close()
_warren_zygote(os, sys, _warren_main, _warren_fields)
"#;

/// The zygote's program for a pool.
pub fn program(f: &warren_proto::FunctionInit) -> String {
    ZYGOTE_PY
        .replace("__PRELOAD__", &crate::warm::preload_imports(f))
        .replace("__DEFS__", crate::warm::PY_DEFS)
        .replace("__STATUS_FD__", &STATUS_FD.to_string())
        .replace(
            "__KEEP__",
            &warren_sys::caps::mask(warren_sys::caps::DEFAULT_KEEP).to_string(),
        )
}

/// Where a call's process forked by the zygote holds its end of the cell's socket (close-on-
/// exec, far above the descriptors a program expects to be the first free ones): the
/// bootstrap reports the program's exit code on it (see [`exit_of`]).
const STATUS_FD: i32 = 63;

/// The zygote's whole life, in a child of the agent made with new mount, ipc and uts
/// namespaces (not pid: a process may only enter a pid namespace below its own, and the
/// cells' are below the agent's) and the agent's socket on `CONTROL_FD`: stages a cell's
/// root, makes it read-only, and becomes the interpreter. The calls' processes it forked
/// outlive it when it dies (they are the agent's then) and still report their exit codes.
/// Never returns.
pub fn main(cfg: &ContainerInit) -> ! {
    let e = match prepare_root(cfg) {
        Ok(()) => exec(cfg),
        Err(e) => e.to_string(),
    };
    eprintln!("warren-agent: zygote: {e}");
    std::process::exit(127)
}

fn prepare_root(cfg: &ContainerInit) -> crate::error::Result<()> {
    use warren_sys::mount::{mount, Flags};
    crate::setup::enter_cell_root(cfg)?;
    // Nothing a call does can write the zygote's files (a call's process reaches them only
    // through what it inherited, e.g. /proc/self/exe).
    mount(
        None,
        Path::new("/"),
        None,
        Flags::MS_REMOUNT | Flags::MS_BIND | Flags::MS_RDONLY,
        None,
    )?;
    // The agent's short time slice is not for calls: its forks get the kernel's default, as
    // the commands a cell starts do.
    warren_sys::process::set_time_slice(0);
    Ok(())
}

/// Execs the interpreter (the agent's socket stays on `CONTROL_FD`); returns only why not.
fn exec(cfg: &ContainerInit) -> String {
    use std::os::unix::process::CommandExt;
    let Some(f) = cfg.function.as_ref() else {
        return "not a function container".into();
    };
    let Some(interpreter) = f.interpreter.as_ref() else {
        return "no interpreter".into();
    };
    let spec = warren_proto::ExecSpec {
        argv: vec![interpreter.clone(), "-c".into(), program(f)],
        output_cap: 0,
        ..Default::default()
    };
    let p = match crate::exec::prepare(&spec) {
        Ok(p) => p,
        Err(e) => return format!("{e:?}"),
    };
    let env: Vec<(String, String)> = p
        .cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
        .collect();
    crate::warm::resolved(p.cmd, &env).exec().to_string()
}

/// A call's interpreter forked by the zygote into this cell, warm.
pub struct Forked {
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
    /// The cell's end of the zygote's socket, where the call's exit is reported
    /// ([`exit_of`]).
    pub status: OwnedFd,
}

/// What the cell asks the zygote for.
pub struct Request<'a> {
    /// The cell's end of the zygote's socket.
    pub sock: OwnedFd,
    /// The Landlock ruleset the call's process enforces on itself (the cell's own is not
    /// enforced on the cell: Landlock would then keep the cell from signalling the call).
    pub ruleset: Option<&'a OwnedFd>,
    /// The seccomp finish filter's program (`CellFilters::finish_bytes`), empty for none.
    pub filter: Vec<u8>,
}

/// Asks the zygote for this cell's warm interpreter; `None` when it gives none (no zygote,
/// a step that failed, or not warm in time): the cell then starts its own.
pub fn request(r: Request<'_>) -> Option<Forked> {
    use nix::fcntl::OFlag;
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).ok();
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let ns: Vec<File> = ["uts", "ipc", "pid", "mnt"]
        .iter()
        .rev()
        .map(|n| File::open(format!("/proc/self/ns/{n}")).ok())
        .collect::<Option<_>>()?;
    // mnt, pid, ipc, uts; then stdin, stdout, stderr; then the ruleset.
    let mut fds: Vec<i32> = ns.iter().map(|f| f.as_raw_fd()).collect();
    fds.extend([in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()]);
    if let Some(r) = r.ruleset {
        fds.push(r.as_raw_fd());
    }
    let keep = warren_sys::caps::mask(warren_sys::caps::DEFAULT_KEEP);
    let mut msg = b"W1".to_vec();
    msg.extend_from_slice(&keep.to_le_bytes());
    msg.extend_from_slice(&r.filter);
    warren_sys::fd::send_fds_with(&r.sock, &msg, &fds).ok()?;
    drop((ns, in_r, out_w, err_w));
    let mut stdout = File::from(out_r);
    if !crate::warm::warm_byte(&mut stdout) {
        return None;
    }
    Some(Forked {
        stdin: File::from(in_w),
        stdout,
        stderr: File::from(err_r),
        status: r.sock,
    })
}

/// Reads the first report on the cell's socket: the program's own exit code (`X` and the
/// code, written by the bootstrap as it exits), or the zygote's wait status of the call's
/// process (4 bytes: a process that ended otherwise); end of file (the process and the
/// zygote are both gone without a word) is a process killed.
pub fn exit_of(status: &OwnedFd) -> crate::run::Exit {
    use nix::sys::wait::WaitStatus;
    let mut b = [0u8; 4];
    let mut f = File::from(match status.try_clone() {
        Ok(f) => f,
        Err(_) => return crate::run::Exit::Signal(libc::SIGKILL),
    });
    match f.read(&mut b) {
        Ok(2) if b[0] == b'X' => crate::run::Exit::Code(i32::from(b[1])),
        Ok(4) => match WaitStatus::from_raw(nix::unistd::Pid::from_raw(0), i32::from_ne_bytes(b)) {
            Ok(WaitStatus::Exited(_, c)) => crate::run::Exit::Code(c),
            Ok(WaitStatus::Signaled(_, s, _)) => crate::run::Exit::Signal(s as i32),
            _ => crate::run::Exit::Signal(libc::SIGKILL),
        },
        _ => crate::run::Exit::Signal(libc::SIGKILL),
    }
}
