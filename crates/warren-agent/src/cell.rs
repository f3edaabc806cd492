//! One call environment of a function container (the `cell` mode of the agent).
//!
//! The agent forks itself with `clone(2)` into PID 1 of new pid, mount, ipc and uts
//! namespaces (see `cells`); that child runs [`main`]. The cell builds a fresh root — a new small tmpfs writable
//! layer over the same read-only image layers, its own /proc, /dev, /dev/shm, /tmp — pivots
//! into it, drops capabilities, applies the seccomp filter, optionally pre-starts an
//! interpreter, says `Ready`, and then runs exactly one call. When the call ends the cell
//! exits: as PID 1 its exit kills whatever the call left running, and its mount namespace
//! with the writable layer disappears. Nothing of one call can reach the next.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use warren_proto::{
    Call, ContainerInit, Event, ExecSpec, Frame, FrameError, FunctionInit, Init, InitReply,
    InvokeSpec, Kind, PROTOCOL_VERSION,
};

use crate::exec::prepare;
use crate::run::{Exit, Run};
use crate::setup::{ETC_LAYER, LOWER_DIR};
use crate::warm::{preload_imports, resolved, warm_byte, PY_DEFS};

use crate::error::{AgentError, Result as R};

/// The start-up configuration the agent sends each cell: its own, with the layers at
/// their paths inside the agent's root, under the agent's [`ETC_LAYER`].
pub fn cell_config(cfg: &ContainerInit) -> ContainerInit {
    let mut c = cfg.clone();
    c.lowerdirs = std::iter::once(ETC_LAYER.to_string())
        .chain((0..cfg.lowerdirs.len()).map(|i| format!("{LOWER_DIR}/{i}")))
        .collect();
    // The agent's own /sys (the node's shared sysfs, or the container's) is shown again: a
    // call adds no sysfs superblock, and no devpts (calls get no terminal).
    c.sysfs = Some("/sys".into());
    c.devpts = false;
    // A call's writable layer is a tmpfs of its own (a function container has no disk one).
    c.writable_dir = None;
    // The agent attached the layers at `LOWER_DIR`: a cell binds those paths.
    c.layer_trees = false;
    // A call's commands stay in the cell's groups (the cell passes no descriptors on).
    c.command_groups = 0;
    c
}

/// The cell's whole life. Never returns. `filters` is the finish half of the seccomp policy (the
/// agent holds the other half).
pub fn main(mut ctl: UnixStream, filters: Option<&warren_sys::seccomp::CellFilters>) -> ! {
    let cfg = match start_config(Frame::read_blocking(&mut ctl)) {
        Ok(config) => config,
        Err(e) => {
            let _ = Frame::json(
                0,
                Kind::Init,
                &InitReply::Failed {
                    message: e.to_string(),
                },
            )
            .write_blocking(&mut ctl);
            std::process::exit(2)
        }
    };
    // The agent's zygote, when it has one (see `zygote`).
    let zygote = cfg
        .function
        .as_ref()
        .and_then(|f| f.interpreter.as_ref())
        .and_then(|_| warren_sys::fd::inherited(crate::zygote::ZYGOTE_FD).ok());
    let mut landlock = match build(&cfg, filters, zygote.is_some()) {
        Ok(r) => r,
        Err(e) => {
            let message = e.to_string();
            let _ =
                Frame::json(0, Kind::Init, &InitReply::Failed { message }).write_blocking(&mut ctl);
            std::process::exit(1);
        }
    };
    let interpreter = cfg
        .function
        .as_ref()
        .and_then(|f| f.interpreter.as_ref().map(|i| (i, f)));
    let forked = match (interpreter, zygote) {
        (Some((name, _)), Some(sock)) => crate::zygote::request(crate::zygote::Request {
            sock,
            ruleset: landlock.as_ref(),
            filter: filters.map(|f| f.finish_bytes()).unwrap_or_default(),
        })
        .map(|f| Warm::Forked(name.clone(), f)),
        _ => None,
    };
    let warm = match forked {
        Some(w) => Some(w),
        None => {
            // No interpreter from the zygote: the cell is restricted as without one, and
            // starts its own.
            if let Some(r) = landlock.take() {
                if let Err(e) = warren_sys::landlock::enforce(&r) {
                    let message = e.to_string();
                    let _ = Frame::json(0, Kind::Init, &InitReply::Failed { message })
                        .write_blocking(&mut ctl);
                    std::process::exit(1);
                }
            }
            interpreter
                .and_then(|(i, f)| WarmPython::start(i, f))
                .map(Warm::Spawned)
        }
    };
    if Frame::json(
        0,
        Kind::Init,
        &InitReply::Ready {
            version: PROTOCOL_VERSION,
        },
    )
    .write_blocking(&mut ctl)
    .is_err()
    {
        std::process::exit(1);
    }
    match first_call(Frame::read_blocking(&mut ctl)) {
        FirstCall::Run(stream, spec) => run(ctl, stream, spec, warm, landlock),
        FirstCall::Retired => {}
        FirstCall::Unexpected(stream, e) => {
            let ev = Event::error(e.code(), e.to_string());
            let _ = Frame::json(stream, Kind::Event, &ev).write_blocking(&mut ctl);
            std::process::exit(3)
        }
    }
    std::process::exit(0)
}

/// The configuration in a cell's start-up message.
fn start_config(f: Result<Frame, FrameError>) -> R<ContainerInit> {
    match f.map(|f| f.parse::<Init>()) {
        Ok(Ok(Init::Container { config, .. })) => Ok(*config),
        other => Err(AgentError::Protocol(format!(
            "cell: bad start-up message {other:?}"
        ))),
    }
}

/// What a ready cell does with the first frame it is sent.
#[derive(Debug)]
enum FirstCall {
    /// Runs the call and reports it on its stream.
    Run(u32, InvokeSpec),
    /// The agent went away (or retired this cell) before giving it a call: exit quietly.
    Retired,
    /// Anything else is answered with an error on its stream.
    Unexpected(u32, AgentError),
}

fn first_call(f: Result<Frame, FrameError>) -> FirstCall {
    match f.as_ref().map(|f| (f.stream, f.parse::<Call>())) {
        Ok((stream, Ok(Call::Invoke { spec }))) => FirstCall::Run(stream, spec),
        Err(_) => FirstCall::Retired,
        Ok((stream, other)) => FirstCall::Unexpected(
            stream,
            AgentError::Protocol(format!(
                "call environment: unexpected first frame {other:?}"
            )),
        ),
    }
}

/// Builds the cell's root and restricts the cell. With `defer_landlock` (a zygote's
/// interpreter is asked for) the Landlock ruleset is made but not enforced, and returned:
/// the call's process enforces it on itself, and the cell enforces it before it starts
/// anything of its own.
fn build(
    cfg: &ContainerInit,
    filters: Option<&warren_sys::seccomp::CellFilters>,
    defer_landlock: bool,
) -> R<Option<OwnedFd>> {
    // A session (and process group) of its own, which what the cell starts inherits:
    // `kill(0, …)` signals the caller's process group, and the kernel finds its members
    // across pid namespaces. In the agent's group, a call's `kill -9 0` reached the agent
    // and every other cell of the container wherever Landlock cannot scope signals (before
    // Linux 6.12, or `--no-landlock`).
    nix::unistd::setsid().map_err(|e| AgentError::Setup(format!("setsid: {e}")))?;
    crate::setup::enter_cell_root(cfg)?;
    // The agent may run with a protective OOM score, which the cell inherits and cannot
    // change (it is not dumpable: its /proc files are not its own). Each command it starts is
    // made the OOM killer's first choice instead (see `oom_victim`).
    warren_sys::caps::restrict_to(warren_sys::caps::DEFAULT_KEEP)?;
    warren_sys::process::set_no_new_privs()?;
    warren_sys::process::set_non_dumpable()?;
    let mut ruleset = None;
    if cfg.landlock && defer_landlock {
        ruleset = warren_sys::landlock::sandbox_ruleset(Path::new("/"), Path::new("/dev"))?;
    } else if cfg.landlock {
        warren_sys::landlock::restrict_sandbox(Path::new("/"), Path::new("/dev"))?;
    }
    if cfg.seccomp {
        // Namespaces are made: from here on nothing in this cell may make more.
        filters
            .ok_or_else(|| AgentError::Setup("seccomp filters missing".into()))?
            .finish()?;
    }
    Ok(ruleset)
}

/// The cell's warm interpreter.
enum Warm {
    /// Started by the cell.
    Spawned(WarmPython),
    /// Forked by the zygote (named as the pool names its interpreter).
    Forked(String, crate::zygote::Forked),
}

impl Warm {
    /// The header for `argv` if the warm interpreter can run it.
    fn header(&self, spec: &ExecSpec, env: &[(String, String)], cwd: &str) -> Option<Vec<u8>> {
        match self {
            Warm::Spawned(w) => w.header(spec, env, cwd),
            Warm::Forked(name, _) => warm_header(name, spec, env, cwd),
        }
    }
}

/// Bootstrap of a pre-started Python: imports, writes one byte to say it is warm (the cell
/// reads it before it says `Ready`), then waits on stdin for a length-prefixed header (see
/// [`warm_header`]); the rest of stdin is the program's. The bootstrap imports nothing beyond
/// what every interpreter has loaded at start (`os`, `sys`): a warm interpreter is prepared
/// for every call, and a module it imported for itself would be paid for by each (a script
/// is compiled and run directly, not through `runpy`, whose imports cost as much CPU as the
/// interpreter's own start). The program runs in the `__main__` module, emptied of the
/// bootstrap's names, as `python3 -c` or `python3 SCRIPT` runs it (so what it defines can be
/// pickled by reference); the bootstrap keeps what it needs in its frame.
const PY_BOOT: &str = r#"
import os, sys
__PRELOAD__
os.write(1, b"R")
__DEFS__
_warren_main(os, sys, _warren_fields)
"#;

/// A Python interpreter started ahead of the call.
struct WarmPython {
    name: String,
    child: Child,
}

impl WarmPython {
    fn start(interpreter: &str, f: &FunctionInit) -> Option<WarmPython> {
        let preload = preload_imports(f);
        let boot = PY_BOOT
            .replace("__PRELOAD__", &preload)
            .replace("__DEFS__", PY_DEFS);
        let spec = ExecSpec {
            argv: vec![interpreter.to_string(), "-c".into(), boot],
            output_cap: 0,
            ..Default::default()
        };
        let p = prepare(&spec).ok()?;
        let env: Vec<(String, String)> = p
            .cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
            .collect();
        let mut cmd = resolved(p.cmd, &env);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = oom_victim(cmd.spawn().ok()?);
        // Ready only when warm: a call that comes earlier waits for the cell (which the daemon
        // sees, and answers by growing the pool), not inside the interpreter's start.
        if !warmed_up(&mut child) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        Some(WarmPython {
            name: interpreter.to_string(),
            child,
        })
    }

    /// The header for `argv` if the warm interpreter can run it.
    fn header(&self, spec: &ExecSpec, env: &[(String, String)], cwd: &str) -> Option<Vec<u8>> {
        warm_header(&self.name, spec, env, cwd)
    }
}

/// The header that makes a warm `interpreter` run `spec` (as root, `-c CODE` or a script
/// path); `None` when the call needs a cold start.
///
/// The header is the payload's length in decimal and a newline, then the payload: fields,
/// each its length in bytes in decimal, a newline and the bytes (UTF-8): `code` or `path`,
/// the code or the script's path, the working directory, the number of arguments, the
/// arguments (`sys.argv`), then the environment as name and value pairs. Lengths, not
/// separators: any byte may appear in a field. Read by [`PY_BOOT`] without importing
/// anything.
fn warm_header(
    interpreter: &str,
    spec: &ExecSpec,
    env: &[(String, String)],
    cwd: &str,
) -> Option<Vec<u8>> {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let a = &spec.argv;
    if a.is_empty() || base(&a[0]) != base(interpreter) {
        return None;
    }
    if spec
        .user
        .as_deref()
        .is_some_and(|u| u != "root" && u != "0")
    {
        return None;
    }
    let (kind, body, argv): (&str, &str, Vec<&str>) = match a.get(1).map(String::as_str) {
        Some("-c") if a.len() >= 3 => (
            "code",
            &a[2],
            std::iter::once("-c")
                .chain(a[3..].iter().map(String::as_str))
                .collect(),
        ),
        Some(p) if !p.starts_with('-') => ("path", p, a[1..].iter().map(String::as_str).collect()),
        _ => return None,
    };
    let argc = argv.len().to_string();
    let fields = [kind, body, cwd, &argc]
        .into_iter()
        .chain(argv)
        .chain(env.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]));
    let mut body = Vec::new();
    for f in fields {
        body.extend_from_slice(f.len().to_string().as_bytes());
        body.push(b'\n');
        body.extend_from_slice(f.as_bytes());
    }
    let mut h = format!("{}\n", body.len()).into_bytes();
    h.extend_from_slice(&body);
    Some(h)
}

/// Waits for the interpreter's "warm" byte. False when it exited (a preload failed to import)
/// or took too long.
fn warmed_up(child: &mut Child) -> bool {
    match child.stdout.as_mut() {
        Some(out) => warm_byte(out),
        None => false,
    }
}

/// Input from the agent: file contents then the command's stdin.
struct Input {
    ctl: UnixStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Input {
    /// Reads frames until at least `n` bytes are buffered (or EOF). False on cancel or a lost
    /// agent.
    fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n && !self.eof {
            match Frame::read_blocking(&mut self.ctl) {
                Ok(f) => match f.kind {
                    Kind::Stdin => self.buf.extend_from_slice(&f.payload),
                    Kind::Eof => self.eof = true,
                    Kind::Cancel => return false,
                    _ => {}
                },
                Err(_) => return false,
            }
        }
        true
    }
}

fn write_file(path: &str, data: &[u8], mode: Option<u32>) -> R<()> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |source| AgentError::WriteFile {
        path: path.to_string(),
        source,
    };
    let p = Path::new(path);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).map_err(failed)?;
    }
    std::fs::write(p, data).map_err(failed)?;
    if let Some(m) = mode {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m & 0o7777)).map_err(failed)?;
    }
    Ok(())
}

/// Starts `cmd`, which has no pre-exec hook, with what the command must have from its first
/// instruction: the cell's whole CPU mask and the kernel's default time slice. Without a hook
/// nothing can change them in the child before it runs, and set from here after the start they
/// raced the command: one that reads its mask at once (`nproc`, a build's `-j`) saw one CPU.
/// So the start is not narrowed to this CPU (as a hooked one is, `crate::exec::spawn`), and
/// the default slice is set on the cell itself first, for the child to inherit (the cell only
/// waits for the command from here on).
fn spawn_unhooked(
    cmd: &mut std::process::Command,
    slice: Option<warren_sys::process::TimeSlice>,
) -> std::io::Result<Child> {
    if let Some(s) = &slice {
        s.apply();
    }
    cmd.spawn()
}

/// Makes `child` the OOM killer's first choice, as the agent does for a sandbox's commands:
/// never the cell (the call's PID 1) or the container's agent. Written from here: the child
/// of a non-dumpable process cannot write its own `/proc/self` files before it has exec'd.
fn oom_victim(child: Child) -> Child {
    warren_sys::process::make_oom_victim(child.id());
    child
}

fn kill_all() {
    // From PID 1 of a pid namespace, kill(-1) reaches every other process in it.
    let _ = warren_sys::process::kill_everyone_else(libc::SIGKILL);
}

fn error_exit(ctl: &mut UnixStream, stream: u32, code: warren_types::ErrorCode, msg: String) {
    let _ = Frame::json(stream, Kind::Event, &Event::error(code, msg)).write_blocking(ctl);
}

fn nonblocking(fd: impl Into<OwnedFd>) -> Option<std::fs::File> {
    let fd: OwnedFd = fd.into();
    warren_sys::fd::set_nonblocking(&fd).ok()?;
    Some(std::fs::File::from(fd))
}

/// Runs one call and reports it on `stream`: one thread, one poll loop over the command's
/// output pipes, its stdin, its pidfd and the agent's socket.
/// The process that runs a call: its pipes, and where its exit is learnt (its pidfd, or the
/// reports on the zygote's socket when the cell did not start it).
struct Proc {
    pid: u32,
    stdin: Option<std::fs::File>,
    stdout: Option<std::fs::File>,
    stderr: Option<std::fs::File>,
    status: Option<OwnedFd>,
}

impl Proc {
    fn child(mut c: Child) -> Proc {
        Proc {
            pid: c.id(),
            stdin: c.stdin.take().and_then(nonblocking),
            stdout: c.stdout.take().and_then(nonblocking),
            stderr: c.stderr.take().and_then(nonblocking),
            status: None,
        }
    }
}

fn run(
    ctl: UnixStream,
    stream: u32,
    spec: InvokeSpec,
    warm: Option<Warm>,
    landlock: Option<OwnedFd>,
) {
    let mut run = Run::new(stream, spec.exec.output_cap);
    let mut input = Input {
        ctl,
        buf: Vec::new(),
        eof: false,
    };
    // Files first.
    let mut off = 0usize;
    for f in &spec.files {
        let end = off + f.size as usize;
        if !input.fill(end) {
            std::process::exit(5);
        }
        if input.buf.len() < end {
            return error_exit(
                &mut input.ctl,
                stream,
                warren_types::ErrorCode::InvalidRequest,
                format!("input ended inside file {}", f.path),
            );
        }
        if let Err(e) = write_file(&f.path, &input.buf[off..end], f.mode) {
            return error_exit(
                &mut input.ctl,
                stream,
                e.code(),
                format!("cannot write {e}"),
            );
        }
        off = end;
    }
    input.buf.drain(..off);
    let Input {
        ctl: mut sock,
        buf: pending_in,
        eof: input_eof,
    } = input;

    let exec = &spec.exec;
    let prep = match prepare(exec) {
        Ok(p) => p,
        Err(ev) => {
            let _ = Frame::json(stream, Kind::Event, &ev).write_blocking(&mut sock);
            return;
        }
    };
    let env: Vec<(String, String)> = prep
        .cmd
        .get_envs()
        .filter_map(|(k, v)| {
            Some((
                k.to_str()?.to_string(),
                v.and_then(|v| v.to_str())?.to_string(),
            ))
        })
        .collect();
    let cwd = prep
        .cmd
        .get_current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "/".into());
    let header = warm.as_ref().and_then(|w| w.header(exec, &env, &cwd));
    let mut stdin_buf: std::collections::VecDeque<u8> = Default::default();
    let child = match (header, warm) {
        (Some(h), Some(w)) => {
            stdin_buf.extend(h);
            match w {
                Warm::Spawned(w) => Proc::child(w.child),
                Warm::Forked(_, f) => Proc {
                    pid: 0,
                    stdin: nonblocking(f.stdin),
                    stdout: nonblocking(f.stdout),
                    stderr: nonblocking(f.stderr),
                    status: Some(f.status),
                },
            }
        }
        (_, w) => {
            // The warm interpreter (if any) is not used by this call.
            drop(w);
            kill_all();
            // What the cell starts itself is held by its Landlock ruleset.
            if let Some(r) = &landlock {
                if let Err(e) = warren_sys::landlock::enforce(r) {
                    return error_exit(
                        &mut sock,
                        stream,
                        warren_types::ErrorCode::Internal,
                        e.to_string(),
                    );
                }
            }
            // Root needs no id switch and no session of its own (the whole cell goes at the
            // end): without a pre-exec hook, and with the program's path resolved here, the
            // command starts with a vfork-style spawn instead of a copy of this process.
            let non_root = prep
                .setup
                .ids
                .as_ref()
                .is_some_and(|(u, g, _)| *u != 0 || *g != 0);
            let hooked = non_root || prep.setup.sched_idle || prep.setup.apparmor_profile.is_some();
            let mut cmd = if hooked {
                prep.cmd
            } else {
                resolved(prep.cmd, &env)
            };
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let spawned = if hooked {
                crate::exec::spawn(&mut cmd, prep.setup)
            } else {
                spawn_unhooked(&mut cmd, prep.setup.default_time_slice)
            };
            match spawned {
                Ok(c) => Proc::child(oom_victim(c)),
                Err(err) => {
                    let (frame, ev) = run.spawn_failed(&exec.argv[0], &err);
                    let _ = frame.write_blocking(&mut sock);
                    let _ = Frame::json(stream, Kind::Event, &ev).write_blocking(&mut sock);
                    return;
                }
            }
        }
    };
    let Proc {
        pid,
        mut stdin,
        stdout: mut out,
        stderr: mut err,
        status,
    } = child;
    let _ = Frame::json(stream, Kind::Event, &Event::Started { pid }).write_blocking(&mut sock);
    if exec.stdin {
        stdin_buf.extend(pending_in);
    }
    // Without stdin the command sees EOF at once (after the interpreter's header).
    let mut stdin_open = exec.stdin && !input_eof;
    let pidfd = match status {
        Some(_) => None,
        None => warren_sys::pidfd::open(pid).ok(),
    };
    let deadline = exec
        .timeout_ms
        .map(|t| run.started() + Duration::from_millis(t));
    let mut cancelled = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if stdin.is_some() && stdin_buf.is_empty() && !stdin_open {
            stdin = None;
        }
        let exit = run.exit();
        if exit.is_some() && out.is_none() && err.is_none() {
            break;
        }
        use nix::poll::{PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds: Vec<PollFd> = Vec::with_capacity(5);
        let mut slots = [usize::MAX; 5];
        fn add<'a>(
            slots: &mut [usize; 5],
            i: usize,
            fd: std::os::fd::BorrowedFd<'a>,
            ev: PollFlags,
            fds: &mut Vec<PollFd<'a>>,
        ) {
            slots[i] = fds.len();
            fds.push(PollFd::new(fd, ev));
        }
        if let Some(o) = &out {
            add(&mut slots, 0, o.as_fd(), PollFlags::POLLIN, &mut fds);
        }
        if let Some(e) = &err {
            add(&mut slots, 1, e.as_fd(), PollFlags::POLLIN, &mut fds);
        }
        if let (Some(i), false) = (&stdin, stdin_buf.is_empty()) {
            add(&mut slots, 2, i.as_fd(), PollFlags::POLLOUT, &mut fds);
        }
        if let (Some(p), None) = (pidfd.as_ref().or(status.as_ref()), exit) {
            add(&mut slots, 3, p.as_fd(), PollFlags::POLLIN, &mut fds);
        }
        add(&mut slots, 4, sock.as_fd(), PollFlags::POLLIN, &mut fds);
        let wait = match (deadline, exit) {
            (Some(d), None) if !run.timed_out() => {
                let left = d.saturating_duration_since(Instant::now());
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
            _ => PollTimeout::NONE,
        };
        match nix::poll::poll(&mut fds, wait) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let ready = |i: usize| {
            let s = slots[i];
            s != usize::MAX && fds[s].revents().is_some_and(|r| !r.is_empty())
        };
        let (r_out, r_err, r_in, r_pid, r_sock) =
            (ready(0), ready(1), ready(2), ready(3), ready(4));
        drop(fds);
        for (is_err, hit) in [(false, r_out), (true, r_err)] {
            if !hit {
                continue;
            }
            let (pipe, kind) = if is_err {
                (&mut err, Kind::Stderr)
            } else {
                (&mut out, Kind::Stdout)
            };
            let Some(p) = pipe.as_mut() else { continue };
            match p.read(&mut buf) {
                Ok(0) => *pipe = None,
                Ok(n) => {
                    if let Some(f) = run.output(kind, &buf[..n]) {
                        if f.write_blocking(&mut sock).is_err() {
                            kill_all();
                            std::process::exit(1);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *pipe = None,
            }
        }
        if r_in {
            if let Some(i) = stdin.as_mut() {
                let (a, _) = stdin_buf.as_slices();
                match i.write(a) {
                    Ok(n) => {
                        stdin_buf.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => {
                        stdin = None;
                        stdin_buf.clear();
                    }
                }
            }
        }
        if r_sock {
            match Frame::read_blocking(&mut sock) {
                Ok(f) => match f.kind {
                    Kind::Stdin if exec.stdin => stdin_buf.extend(f.payload.iter()),
                    Kind::Eof => stdin_open = false,
                    Kind::Cancel => {
                        cancelled = true;
                        kill_all();
                    }
                    _ => {}
                },
                Err(_) => {
                    // The agent is gone: nobody wants the result.
                    kill_all();
                    std::process::exit(1);
                }
            }
        }
        if let (true, Some(s)) = (r_pid, &status) {
            run.exited(crate::zygote::exit_of(s));
            // The call is over: whatever it left running goes now, so its pipes close.
            kill_all();
            stdin = None;
        } else if status.is_none() && (r_pid || (pidfd.is_none() && exit.is_none())) {
            use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
            let flag = if pidfd.is_some() {
                None
            } else {
                Some(WaitPidFlag::WNOHANG)
            };
            match waitpid(nix::unistd::Pid::from_raw(pid as i32), flag) {
                Ok(WaitStatus::Exited(_, c)) => run.exited(Exit::Code(c)),
                Ok(WaitStatus::Signaled(_, s, _)) => run.exited(Exit::Signal(s as i32)),
                Ok(_) => {}
                Err(_) => run.exited(Exit::Signal(libc::SIGKILL)),
            }
            if run.exit().is_some() {
                // The call is over: whatever it left running goes now, so its pipes close.
                kill_all();
                stdin = None;
            }
        }
        if run.exit().is_none() && !run.timed_out() && deadline.is_some_and(|d| Instant::now() >= d)
        {
            run.time_out();
            kill_all();
        }
    }
    if cancelled {
        std::process::exit(4);
    }
    for path in &spec.collect {
        let _ = Frame::json(stream, Kind::Event, &collect(path, spec.collect_cap))
            .write_blocking(&mut sock);
    }
    let _ = Frame::json(stream, Kind::Event, &run.finish()).write_blocking(&mut sock);
}

/// A file the call asked back, read after everything the call started is gone. Only a
/// regular file is read: a FIFO would block the open (no writer is left, so for ever: the
/// call never ends and its container is never given back), and a device such as /dev/zero
/// reports no size but reads without end. The open does not wait (`O_NONBLOCK`, which a
/// regular file ignores) and the kind is checked on the opened file, so a symlink to one
/// of them is refused too.
fn collect(path: &str, cap: u64) -> Event {
    use base64::Engine;
    use std::os::unix::fs::OpenOptionsExt;
    let read = || -> std::io::Result<(Vec<u8>, u64)> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        let md = f.metadata()?;
        if !md.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        let size = md.len();
        let mut data = Vec::new();
        f.take(cap).read_to_end(&mut data)?;
        Ok((data, size))
    };
    match read() {
        Ok((data, size)) => Event::Collected {
            path: path.to_string(),
            truncated: size > data.len() as u64,
            data: base64::engine::general_purpose::STANDARD.encode(&data),
            size,
            error: None,
        },
        Err(e) => Event::Collected {
            path: path.to_string(),
            data: String::new(),
            size: 0,
            truncated: false,
            error: Some(if e.kind() == std::io::ErrorKind::NotFound {
                "not found".to_string()
            } else {
                e.to_string()
            }),
        },
    }
}

#[cfg(test)]
#[path = "cell_tests.rs"]
mod tests;
