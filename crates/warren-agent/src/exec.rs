//! Running commands: foreground (output streamed), background (output kept), terminals.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use warren_proto::{Control, Event, ExecSpec, Frame, Kind, ProcEntry};
use warren_sys::process::ChildSetup;
use warren_types::{ErrorCode, ProcessState};

use crate::reaper::{kill_command, kill_command_fully, kill_tree, start_ticks, Reaper};
use crate::run::{exit_event, spawn_failed, Exit, Pump, Run};
use crate::wire::{event, Inbox, Out};

/// The agent's commands: the reaper that hears their exits, the background processes, and
/// the leaders of the foreground commands running now.
pub struct Commands {
    pub reaper: Rc<Reaper>,
    pub procs: Procs,
    /// Leaders of running foreground commands.
    pub active: RefCell<std::collections::HashSet<u32>>,
    /// Results of the commands of logged steps, until the daemon has logged them.
    pub held: crate::held::Held,
}

impl Commands {
    pub fn new(reaper: Rc<Reaper>) -> Commands {
        Commands {
            reaper,
            procs: Procs::default(),
            active: RefCell::default(),
            held: crate::held::Held::default(),
        }
    }

    /// Leaders of every other live command, whose processes a timeout must spare.
    pub fn others(&self, leader: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .active
            .borrow()
            .iter()
            .copied()
            .filter(|p| *p != leader)
            .collect();
        v.extend(self.procs.running().into_iter().filter(|p| *p != leader));
        v
    }
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// After the command exits, how long to keep reading output its background children hold open.
/// The grace ends only when the pipes are empty: output the command wrote before it exited
/// is always delivered, however late this task runs or the reader grants credit.
const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// Past this much output read after the exit, the drain stops at the next grace even with
/// bytes waiting: they come from children still writing, not from the command (a pipe holds
/// at most 1 MiB by default).
const DRAIN_MAX_AFTER_EXIT: u64 = 4 << 20;
const CHUNK: usize = 64 * 1024;
/// Finished background processes remembered for `wait`.
const MAX_FINISHED: usize = 1024;
/// Bytes of output the agent keeps for all background processes together (their buffers'
/// capacity, counted as they grow). The agent's memory is the sandbox's plus a small margin:
/// output past this is dropped and counted (the process's result says `truncated`), however
/// many noisy processes a sandbox starts.
pub const BACKGROUND_KEPT_MAX: usize = 16 << 20;

/// The sandbox is of the best-effort CPU class: commands start under `SCHED_IDLE`.
static BEST_EFFORT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_best_effort(on: bool) {
    BEST_EFFORT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The AppArmor profile commands are confined under, when the host has AppArmor.
static APPARMOR: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

pub fn set_apparmor_profile(name: Option<&str>) -> crate::error::Result<()> {
    if let Some(n) = name {
        let c = std::ffi::CString::new(n).map_err(|_| {
            crate::error::AgentError::Invalid("AppArmor profile name has a NUL".into())
        })?;
        let _ = APPARMOR.set(c);
    }
    Ok(())
}

/// The `cgroup.procs` files of the sandbox's leaf group of commands, opened by the daemon
/// and passed at start-up (none: commands stay in the sandbox's groups). Every command moves
/// itself there before its `execve`, so an OOM kill among the commands never takes the agent.
static COMMAND_GROUPS: std::sync::OnceLock<Vec<OwnedFd>> = std::sync::OnceLock::new();

pub fn set_command_groups(fds: Vec<OwnedFd>) {
    let _ = COMMAND_GROUPS.set(fds);
}

fn command_groups() -> Vec<std::os::fd::RawFd> {
    COMMAND_GROUPS
        .get()
        .map(|v| v.iter().map(|f| f.as_raw_fd()).collect())
        .unwrap_or_default()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) struct Prepared {
    pub cmd: Command,
    pub setup: ChildSetup,
}

pub(crate) fn prepare(spec: &ExecSpec) -> Result<Prepared, Event> {
    if spec.argv.is_empty() {
        return Err(Event::error(ErrorCode::InvalidRequest, "empty argv"));
    }
    let user = crate::users::resolve(spec.user.as_deref())
        .map_err(|e| Event::error(e.code(), e.to_string()))?;
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]);
    cmd.env_clear();
    let has = |k: &str| spec.env.iter().any(|(n, _)| n == k);
    if !has("PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    if !has("HOME") {
        cmd.env("HOME", &user.home);
    }
    if !has("USER") && !user.name.is_empty() {
        cmd.env("USER", &user.name);
    }
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    let cwd = spec.cwd.clone().unwrap_or_else(|| {
        if std::path::Path::new(&user.home).is_dir() {
            user.home.clone()
        } else {
            "/".into()
        }
    });
    if !std::path::Path::new(&cwd).is_dir() {
        return Err(Event::error(
            ErrorCode::InvalidRequest,
            format!("working directory {cwd} does not exist in the sandbox"),
        ));
    }
    cmd.current_dir(cwd);
    let setup = ChildSetup {
        new_session: true,
        controlling_tty: false,
        ids: Some((user.uid, user.gid, user.groups)),
        sched_idle: BEST_EFFORT.load(std::sync::atomic::Ordering::Relaxed),
        apparmor_profile: APPARMOR.get().cloned(),
        affinity: None,
        default_time_slice: warren_sys::process::TimeSlice::for_current(0),
        join_cgroups: command_groups(),
        exit_instead: None,
    };
    Ok(Prepared { cmd, setup })
}

/// Starts `cmd` on the agent's own CPU (see [`warren_sys::process::PlaceOnThisCpu`]): the
/// agent sleeps right after, so the command starts at once instead of waiting for a CPU a
/// neighbour floods.
pub(crate) fn spawn(
    cmd: &mut Command,
    mut setup: ChildSetup,
) -> std::io::Result<std::process::Child> {
    let place = warren_sys::process::PlaceOnThisCpu::new();
    setup.affinity = place.as_ref().map(|p| p.saved());
    warren_sys::process::configure_child(cmd, setup);
    cmd.spawn()
}

fn receiver(fd: impl Into<OwnedFd>) -> Option<pipe::Receiver> {
    let fd: OwnedFd = fd.into();
    warren_sys::fd::set_nonblocking(&fd).ok()?;
    pipe::Receiver::from_owned_fd(fd).ok()
}

/// Runs a command to completion, streaming its output as frames.
pub async fn foreground(
    spec: ExecSpec,
    id: u32,
    mut inbox: Inbox,
    out: &Out,
    state: &Commands,
) -> Event {
    let mut run = Run::new(id, spec.output_cap);
    let Prepared { mut cmd, setup } = match prepare(&spec) {
        Ok(p) => p,
        Err(ev) => return ev,
    };
    cmd.stdin(if spec.stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = match spawn(&mut cmd, setup) {
        Ok(c) => {
            warren_sys::process::make_oom_victim(c.id());
            c
        }
        Err(err) => {
            let (frame, ev) = run.spawn_failed(&spec.argv[0], &err);
            let _ = out.send(frame).await;
            return ev;
        }
    };
    let pid = child.id();
    let mut exit_rx = state.reaper.watch(pid);
    let since = start_ticks(pid);
    state.active.borrow_mut().insert(pid);
    // A logged step's command runs to its end whatever happens to the daemon, and its
    // result is held until the daemon has logged it (see `crate::held`).
    let held = spec.hold.as_ref().map(|h| state.held.start(h));
    // Stdin cut off by the daemon's going away: the run is not the one asked for.
    let mut disturbed = false;
    let kill_all = || {
        kill_command(pid, since, &state.others(pid));
    };
    let _ = event(out, id, &Event::Started { pid }).await;
    let mut stdout = child.stdout.take().and_then(receiver);
    let mut stderr = child.stderr.take().and_then(receiver);
    let mut stdin = child.stdin.take().and_then(|s| {
        pipe::Sender::from_owned_fd({
            let fd: OwnedFd = s.into();
            let _ = warren_sys::fd::set_nonblocking(&fd);
            fd
        })
        .ok()
    });
    let mut pending: VecDeque<bytes::Bytes> = VecDeque::new();
    let mut stdin_eof = false;
    let mut credit: Option<u64> = spec.window.map(u64::from);
    let mut exited_at = Instant::now();
    let deadline = spec
        .timeout_ms
        .map(|t| tokio::time::Instant::now() + Duration::from_millis(t));
    let mut inbox_open = true;
    let (mut bo, mut be) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut after_exit: u64 = 0;
    loop {
        let exit = run.exit();
        if exit.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        let room = |p: &Pump| credit.is_none_or(|c| c > 0) || p.full();
        let want = |p: &Pump| {
            if p.full() {
                CHUNK
            } else {
                credit.map_or(CHUNK, |c| (c as usize).clamp(1, CHUNK))
            }
        };
        let (wo, we) = (want(&run.stdout), want(&run.stderr));
        let (ro, re) = (room(&run.stdout), room(&run.stderr));
        tokio::select! {
            r = async { stdout.as_mut().unwrap().read(&mut bo[..wo]).await }, if stdout.is_some() && ro => match r {
                Ok(0) | Err(_) => stdout = None,
                Ok(n) => {
                    if exit.is_some() {
                        after_exit += n as u64;
                    }
                    if let Some(f) = run.output(Kind::Stdout, &bo[..n]) {
                        credit = credit.map(|c| c.saturating_sub(f.payload.len() as u64));
                        if let Some(h) = &held {
                            h.keep(f.kind, &f.payload);
                        }
                        if out.send(f).await.is_err() && held.is_none() {
                            kill_all();
                        }
                    }
                }
            },
            r = async { stderr.as_mut().unwrap().read(&mut be[..we]).await }, if stderr.is_some() && re => match r {
                Ok(0) | Err(_) => stderr = None,
                Ok(n) => {
                    if exit.is_some() {
                        after_exit += n as u64;
                    }
                    if let Some(f) = run.output(Kind::Stderr, &be[..n]) {
                        credit = credit.map(|c| c.saturating_sub(f.payload.len() as u64));
                        if let Some(h) = &held {
                            h.keep(f.kind, &f.payload);
                        }
                        if out.send(f).await.is_err() && held.is_none() {
                            kill_all();
                        }
                    }
                }
            },
            r = async { stdin.as_mut().unwrap().write(pending.front().unwrap()).await }, if stdin.is_some() && !pending.is_empty() => match r {
                Ok(n) => {
                    let front = pending.front_mut().unwrap();
                    if n >= front.len() { pending.pop_front(); } else { *front = front.slice(n..); }
                    if pending.is_empty() && stdin_eof { stdin = None; }
                }
                Err(_) => { stdin = None; pending.clear(); }
            },
            st = &mut exit_rx, if exit.is_none() => {
                run.exited(st.unwrap_or(Exit::Signal(libc::SIGKILL)));
                exited_at = Instant::now();
                if spec.kill_tree {
                    // Everything the command started ends with it (its pipes close too).
                    kill_command_fully(pid, since, &state.others(pid)).await;
                }
            },
            f = inbox.recv(), if inbox_open => match f {
                Some(f) => match f.kind {
                    Kind::Stdin => pending.push_back(f.payload),
                    Kind::Eof => { stdin_eof = true; if pending.is_empty() { stdin = None; } }
                    Kind::Credit => { if let (Some(c), Ok(n)) = (credit.as_mut(), f.credit_value()) { *c += u64::from(n); } }
                    // A held command is never cancelled: its step must run once.
                    Kind::Cancel if held.is_none() => kill_all(),
                    _ => {}
                },
                None => {
                    inbox_open = false;
                    if held.is_none() {
                        kill_all();
                    } else {
                        // Runs on unthrottled; stdin that was still coming ends here.
                        credit = None;
                        if stdin.is_some() && !stdin_eof {
                            disturbed = true;
                            stdin = None;
                            pending.clear();
                        }
                    }
                }
            },
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() && !run.timed_out() && exit.is_none() => {
                run.time_out();
                kill_all();
            },
            _ = tokio::time::sleep_until((exited_at + DRAIN_GRACE).into()), if exit.is_some() => {
                // Bytes still in a pipe were written before now: a loaded host may not have
                // run this task in time, or the reader has not granted credit yet. They are
                // read before the end (with a reader still there to take them).
                let waiting = |p: &Option<pipe::Receiver>| {
                    p.as_ref().is_some_and(|r| warren_sys::fd::readable_bytes(r).is_ok_and(|n| n > 0))
                };
                if (inbox_open || held.is_some()) && after_exit < DRAIN_MAX_AFTER_EXIT && (waiting(&stdout) || waiting(&stderr)) {
                    exited_at = Instant::now();
                } else {
                    break;
                }
            },
        }
    }
    drop(child);
    state.active.borrow_mut().remove(&pid);
    let ev = run.finish();
    if let Some(h) = held {
        h.end(&ev, disturbed);
    }
    ev
}

/// A background process and what it has printed so far.
struct Proc {
    argv: Vec<String>,
    started_at_ms: u64,
    started: Instant,
    out: RefCell<Vec<u8>>,
    err: RefCell<Vec<u8>>,
    pumps: Cell<(Pump, Pump)>,
    exit: Cell<Option<Exit>>,
    finished: Cell<Option<Instant>>,
    done: Notify,
}

/// The table of background processes (they outlive the daemon connection).
#[derive(Default)]
pub struct Procs {
    map: RefCell<HashMap<u32, Rc<Proc>>>,
    /// Capacity of every kept output buffer together (at most [`BACKGROUND_KEPT_MAX`]).
    kept: Cell<usize>,
}

impl Procs {
    /// Pids of background processes still running.
    pub fn running(&self) -> Vec<u32> {
        self.map
            .borrow()
            .iter()
            .filter(|(_, p)| p.exit.get().is_none())
            .map(|(pid, _)| *pid)
            .collect()
    }

    pub fn list(&self) -> Vec<ProcEntry> {
        let mut v: Vec<ProcEntry> = self
            .map
            .borrow()
            .iter()
            .map(|(pid, p)| {
                let (exit_code, signal) = match p.exit.get() {
                    Some(Exit::Code(c)) => (Some(c), None),
                    Some(Exit::Signal(s)) => (None, Some(s)),
                    None => (None, None),
                };
                ProcEntry {
                    pid: *pid,
                    argv: p.argv.clone(),
                    state: if p.exit.get().is_some() {
                        ProcessState::Exited
                    } else {
                        ProcessState::Running
                    },
                    exit_code,
                    signal,
                    started_at_ms: p.started_at_ms,
                }
            })
            .collect();
        v.sort_by_key(|p| p.started_at_ms);
        v
    }

    fn prune(&self) {
        let mut map = self.map.borrow_mut();
        let mut finished: Vec<(Instant, u32)> = map
            .iter()
            .filter_map(|(pid, p)| p.finished.get().map(|t| (t, *pid)))
            .collect();
        if finished.len() > MAX_FINISHED {
            finished.sort();
            for (_, pid) in &finished[..finished.len() - MAX_FINISHED] {
                if let Some(p) = map.remove(pid) {
                    let held = p.out.borrow().capacity() + p.err.borrow().capacity();
                    self.kept.set(self.kept.get().saturating_sub(held));
                }
            }
        }
    }
}

async fn collect(mut r: pipe::Receiver, p: Rc<Proc>, is_err: bool, state: Rc<Commands>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let store = if is_err { &p.err } else { &p.out };
                let mut store = store.borrow_mut();
                let kept = &state.procs.kept;
                let (len, cap) = (store.len(), store.capacity());
                // Room left for all background output: the free part of this buffer plus
                // what the sandbox's total still allows it to grow by.
                let room = (cap - len) + BACKGROUND_KEPT_MAX.saturating_sub(kept.get());
                let (mut o, mut e) = p.pumps.get();
                let pump = if is_err { &mut e } else { &mut o };
                let keep = pump.take_within(n, room as u64);
                p.pumps.set((o, e));
                if len + keep > cap {
                    // Grow by doubling, but never past what the total allows.
                    let want = (len + keep).max(cap * 2).min(len + room);
                    store.reserve_exact(want - len);
                }
                store.extend_from_slice(&buf[..keep]);
                kept.set(kept.get() + (store.capacity() - cap));
            }
        }
    }
}

/// A background process whose program cannot be started ends as `prog &` ends in a shell,
/// and as a foreground command's answer says: a process that exits at once with 127 (no such
/// program) or 126 (not executable), the reason on its stderr. Set up as the program would
/// have been; a set-up that fails (the first start's error, again) is the caller's error.
fn stand_in(spec: &ExecSpec, err: &std::io::Error) -> std::io::Result<std::process::Child> {
    let (status, message) = spawn_failed(&spec.argv[0], err);
    let Ok(Prepared { mut cmd, mut setup }) = prepare(spec) else {
        return Err(std::io::Error::new(err.kind(), err.to_string()));
    };
    setup.exit_instead = Some((message.into_bytes(), status));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn(&mut cmd, setup)
}

/// Starts a background process; its output is kept up to the cap for `wait`.
pub async fn background(spec: ExecSpec, state: &Rc<Commands>) -> Event {
    let Prepared { mut cmd, setup } = match prepare(&spec) {
        Ok(p) => p,
        Err(ev) => return ev,
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = spawn(&mut cmd, setup).or_else(|err| stand_in(&spec, &err));
    let mut child = match started {
        Ok(c) => {
            warren_sys::process::make_oom_victim(c.id());
            c
        }
        Err(err) => {
            return Event::error(
                ErrorCode::InvalidRequest,
                spawn_failed(&spec.argv[0], &err).1.trim().to_string(),
            )
        }
    };
    let pid = child.id();
    let exit_rx = state.reaper.watch(pid);
    let since = start_ticks(pid);
    let kill_tree_at_exit = spec.kill_tree.then(|| state.clone());
    let collector = state.clone();
    let p = Rc::new(Proc {
        argv: spec.argv.clone(),
        started_at_ms: now_ms(),
        started: Instant::now(),
        out: RefCell::default(),
        err: RefCell::default(),
        pumps: Cell::new((Pump::new(spec.output_cap), Pump::new(spec.output_cap))),
        exit: Cell::new(None),
        finished: Cell::new(None),
        done: Notify::new(),
    });
    state.procs.prune();
    state.procs.map.borrow_mut().insert(pid, p.clone());
    let o = child.stdout.take().and_then(receiver);
    let e = child.stderr.take().and_then(receiver);
    drop(child);
    let timeout = spec.timeout_ms.map(Duration::from_millis);
    tokio::task::spawn_local(async move {
        let readers = async {
            if let Some(o) = o {
                tokio::task::spawn_local(collect(o, p.clone(), false, collector.clone()));
            }
            if let Some(e) = e {
                tokio::task::spawn_local(collect(e, p.clone(), true, collector));
            }
        };
        readers.await;
        let exit = match timeout {
            Some(t) => match tokio::time::timeout(t, exit_rx).await {
                Ok(r) => r.ok(),
                Err(_) => {
                    kill_tree(pid);
                    None
                }
            },
            None => exit_rx.await.ok(),
        };
        if let Some(state) = kill_tree_at_exit {
            kill_command_fully(pid, since, &state.others(pid)).await;
        }
        p.exit
            .set(Some(exit.unwrap_or(Exit::Signal(libc::SIGKILL))));
        // Let the readers take what is left in the pipes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        p.finished.set(Some(Instant::now()));
        p.done.notify_waiters();
    });
    Event::Started { pid }
}

/// Waits for a background process, then sends its kept output and exit status.
pub async fn wait(
    pid: u32,
    timeout_ms: Option<u64>,
    id: u32,
    out: &Out,
    state: &Commands,
) -> Event {
    let Some(p) = state.procs.map.borrow().get(&pid).cloned() else {
        return Event::error(ErrorCode::NotFound, format!("no background process {pid}"));
    };
    if p.finished.get().is_none() {
        let notified = p.done.notified();
        let wait = async {
            if p.finished.get().is_none() {
                notified.await
            }
        };
        match timeout_ms {
            Some(t) => {
                if tokio::time::timeout(Duration::from_millis(t), wait)
                    .await
                    .is_err()
                {
                    return Event::error(
                        ErrorCode::Timeout,
                        format!("process {pid} still running"),
                    );
                }
            }
            None => wait.await,
        }
    }
    for (kind, buf) in [(Kind::Stdout, &p.out), (Kind::Stderr, &p.err)] {
        // One frame's copy at a time (the kept output is never copied whole).
        let mut at = 0;
        loop {
            let chunk = {
                let b = buf.borrow();
                let end = b.len().min(at + warren_proto::MAX_PAYLOAD);
                b[at.min(end)..end].to_vec()
            };
            if chunk.is_empty() {
                break;
            }
            at += chunk.len();
            if out.send(Frame::new(id, kind, chunk)).await.is_err() {
                return Event::Done;
            }
        }
    }
    let (o, e) = p.pumps.get();
    let end = p.finished.get().unwrap_or_else(Instant::now);
    exit_event(p.exit.get(), false, &o, &e, end.duration_since(p.started))
}

/// Signals a background process's tree.
pub fn kill(pid: u32, signal: i32, state: &Commands) -> Event {
    let Some(p) = state.procs.map.borrow().get(&pid).cloned() else {
        return Event::error(ErrorCode::NotFound, format!("no background process {pid}"));
    };
    if p.exit.get().is_none() {
        if signal == libc::SIGKILL {
            kill_tree(pid);
        } else if let Err(e) = warren_sys::process::kill_group(pid, signal) {
            return Event::error(ErrorCode::InvalidRequest, e.to_string());
        }
    }
    Event::Done
}

/// Runs a command on a new terminal.
pub async fn pty(
    spec: ExecSpec,
    cols: u16,
    rows: u16,
    id: u32,
    mut inbox: Inbox,
    out: &Out,
    state: &Commands,
) -> Event {
    // A terminal has one output and no cap.
    let mut run = Run::new(id, u64::MAX);
    let Prepared { mut cmd, mut setup } = match prepare(&spec) {
        Ok(p) => p,
        Err(ev) => return ev,
    };
    let (master, slave) = match warren_sys::pty::open(cols.max(1), rows.max(1)) {
        Ok(p) => p,
        Err(e) => return Event::error(ErrorCode::Internal, e.to_string()),
    };
    let dup = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
    match (dup(&slave), dup(&slave), dup(&slave)) {
        (Ok(a), Ok(b), Ok(c)) => {
            cmd.stdin(a).stdout(b).stderr(c);
        }
        _ => return Event::error(ErrorCode::Internal, "dup pty"),
    }
    if !spec.env.iter().any(|(k, _)| k == "TERM") {
        cmd.env("TERM", "xterm-256color");
    }
    setup.controlling_tty = true;
    let child = match spawn(&mut cmd, setup) {
        Ok(c) => {
            warren_sys::process::make_oom_victim(c.id());
            c
        }
        Err(err) => {
            return Event::error(
                ErrorCode::InvalidRequest,
                spawn_failed(&spec.argv[0], &err).1.trim().to_string(),
            )
        }
    };
    drop(slave);
    drop(cmd);
    let pid = child.id();
    let mut exit_rx = state.reaper.watch(pid);
    let _ = event(out, id, &Event::Started { pid }).await;
    if warren_sys::fd::set_nonblocking(&master).is_err() {
        kill_tree(pid);
    }
    // `AsyncFd::new` is deprecated for I/O-safety reasons that do not apply: we own `master`
    // and nothing else closes it while it is registered.
    #[allow(deprecated)]
    let master = AsyncFd::new(master);
    let Ok(master) = master else {
        kill_tree(pid);
        return Event::error(ErrorCode::Internal, "pty registration");
    };
    let mut credit: Option<u64> = spec.window.map(u64::from);
    let mut master_open = true;
    let mut buf = vec![0u8; CHUNK];
    let mut inbox_open = true;
    loop {
        let exit = run.exit();
        if exit.is_some() && !master_open {
            break;
        }
        let can_read = master_open && credit.is_none_or(|c| c > 0);
        tokio::select! {
            r = master.readable(), if can_read => {
                let Ok(mut guard) = r else { master_open = false; continue };
                let want = credit.map_or(CHUNK, |c| (c as usize).clamp(1, CHUNK));
                match guard.try_io(|fd| nix::unistd::read(fd.as_raw_fd(), &mut buf[..want]).map_err(std::io::Error::from)) {
                    Ok(Ok(0)) | Ok(Err(_)) => master_open = false,
                    Ok(Ok(n)) => {
                        credit = credit.map(|c| c.saturating_sub(n as u64));
                        if let Some(f) = run.output(Kind::Stdout, &buf[..n]) {
                            if out.send(f).await.is_err() {
                                kill_tree(pid);
                            }
                        }
                    }
                    Err(_would_block) => {}
                }
            },
            st = &mut exit_rx, if exit.is_none() => {
                run.exited(st.unwrap_or(Exit::Signal(libc::SIGKILL)));
                // Drain what the terminal still holds, then stop.
                master_open = false;
                loop {
                    match nix::unistd::read(master.get_ref().as_raw_fd(), &mut buf) {
                        Ok(n) if n > 0 => { let _ = out.send(Frame::new(id, Kind::Stdout, buf[..n].to_vec())).await; }
                        _ => break,
                    }
                }
            },
            f = inbox.recv(), if inbox_open => match f {
                Some(f) => match f.kind {
                    Kind::Stdin => {
                        let mut data = &f.payload[..];
                        while !data.is_empty() {
                            let Ok(mut guard) = master.writable().await else { break };
                            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from)) {
                                Ok(Ok(n)) => data = &data[n..],
                                Ok(Err(_)) => break,
                                Err(_would_block) => {}
                            }
                        }
                    }
                    Kind::Control => {
                        if let Ok(Control::Resize { cols, rows }) = f.parse::<Control>() {
                            let _ = warren_sys::pty::resize(master.get_ref(), cols.max(1), rows.max(1));
                        }
                    }
                    Kind::Credit => { if let (Some(c), Ok(n)) = (credit.as_mut(), f.credit_value()) { *c += u64::from(n); } }
                    Kind::Cancel | Kind::Eof => kill_tree(pid),
                    _ => {}
                },
                None => { inbox_open = false; kill_tree(pid); }
            },
        }
    }
    drop(child);
    run.finish()
}
