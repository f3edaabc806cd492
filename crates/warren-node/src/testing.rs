//! Test doubles: a runtime that makes no sandboxes, and a tiny agent speaking the real
//! protocol over a socketpair so [`AgentConn`] is the real one.
//!
//! Compiled for this crate's unit tests and, behind the `testing` feature, for other crates'
//! tests (`warren-testkit` serves the node's real router over it); never in a binary.

use async_trait::async_trait;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::UnixStream;
use warren_proto::{Call, Event, Frame, Kind};
use warren_runtime::{AgentConn, Instance, PauseStats, Runtime, RuntimeError, SandboxSpec};
use warren_types::{FileKind, FileStat, NodeId, ProcessInfo, ProcessState, SandboxId, Substrate};

use crate::{Manager, NodeConfig, Store};

/// What every fake agent and instance of one [`FakeRuntime`] counts.
#[derive(Default)]
pub struct FakeShared {
    /// Commands the agents were asked to run.
    pub execs: AtomicU64,
    /// Calls that change files or processes (write, mkdir, remove, chmod, kill).
    pub changes: AtomicU64,
    pub pauses: AtomicU64,
    pub resumes: AtomicU64,
    /// `(pid, signal)` of every kill the agents were asked for.
    pub kills: Mutex<Vec<(u32, i32)>>,
    /// Sandboxes frozen now (survives "daemon restarts": adopt reads it).
    pub paused: Mutex<HashSet<SandboxId>>,
}

/// A file (or directory) an agent was given: written, or made by `mkdir`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FakeFile {
    pub data: Bytes,
    pub mode: Option<u32>,
    pub dir: bool,
}

/// The files of one fake sandbox, by path.
pub type FakeFiles = Arc<Mutex<HashMap<String, FakeFile>>>;

/// Answers calls the way the real agent would, without running anything:
/// - `exec`: stdout is the [`warren_proto::ExecSpec`] it received, as JSON; stdin (if any) is
///   echoed after the JSON; stderr is `err` (`err\xff`, not UTF-8, when an argument is
///   `raw-stderr`); exit code 3, or as the command's last word says: `exit:N` exits N,
///   `signal:N` is killed by signal N, `timeout` timed out (killed by 9). A command named
///   `slow` answers after 200 ms;
/// - files: `write_file` keeps the upload (bytes and mode) and `mkdir` the directory in the
///   sandbox's [`FakeFiles`]; `read_file` and `stat` answer what was kept there. Other paths:
///   one whose name starts with `missing` → `not_found`; else `stat`/`list` a file named
///   after the path, `read_file` sends `hello`;
/// - `held` → none; `release` → done;
/// - `spawn` → pid 42; `list_procs` → pid 42; `wait` on pid 42 → `timeout`, on another pid
///   → that process's exit, its code the pid; `kill` (counted in [`FakeShared::kills`]),
///   `chmod`, `remove` → done;
/// - `pty`: writes `<argv> <cols>x<rows>`, echoes input as `echo:<input>`, answers a resize
///   with `resized <cols>x<rows>`; input `exit\r` ends it with exit code 3.
async fn fake_agent(stream: UnixStream, shared: Arc<FakeShared>, files: FakeFiles) {
    let (mut rd, mut wr) = stream.into_split();
    let (frames, mut outbox) = tokio::sync::mpsc::unbounded_channel::<Frame>();
    tokio::spawn(async move {
        while let Some(f) = outbox.recv().await {
            if f.write_async(&mut wr).await.is_err() {
                return;
            }
        }
    });
    let mut stdin: HashMap<u32, Vec<u8>> = Default::default();
    let mut pending_exec: HashMap<u32, warren_proto::ExecSpec> = Default::default();
    // Uploads in flight: stream → (path, mode).
    let mut writes: HashMap<u32, (String, Option<u32>)> = Default::default();
    let mut ptys: HashSet<u32> = Default::default();
    while let Ok(f) = Frame::read_async(&mut rd).await {
        let mut out = Vec::new();
        let ev = |out: &mut Vec<Frame>, id, e: Event| out.push(Frame::json(id, Kind::Event, &e));
        match f.kind {
            Kind::Call => {
                let Ok(call) = f.parse::<Call>() else {
                    continue;
                };
                let id = f.stream;
                match call {
                    Call::Ping => ev(&mut out, id, Event::Pong { version: 1, pid: 1 }),
                    Call::Exec { spec } => {
                        shared.execs.fetch_add(1, Ordering::SeqCst);
                        ev(&mut out, id, Event::Started { pid: 7 });
                        if spec.argv.first().is_some_and(|a| a == "slow") {
                            let frames = frames.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                                let mut out = Vec::new();
                                finish_exec(&mut out, id, &spec, &[]);
                                for f in out {
                                    let _ = frames.send(f);
                                }
                            });
                        } else if spec.stdin {
                            pending_exec.insert(id, spec);
                        } else {
                            finish_exec(&mut out, id, &spec, &[]);
                        }
                    }
                    Call::Spawn { .. } => ev(&mut out, id, Event::Started { pid: 42 }),
                    Call::ListProcs => ev(
                        &mut out,
                        id,
                        Event::Procs {
                            procs: vec![ProcessInfo {
                                pid: 42,
                                argv: vec!["sleep".into()],
                                state: ProcessState::Running,
                                exit_code: None,
                                signal: None,
                                started_at_ms: 1,
                            }],
                        },
                    ),
                    Call::Wait { pid: 42, .. } => ev(
                        &mut out,
                        id,
                        Event::error(warren_types::ErrorCode::Timeout, "still running"),
                    ),
                    Call::Wait { pid, .. } => ev(
                        &mut out,
                        id,
                        Event::Exited(exit_info(Some(pid as i32), None, false, 0, 0)),
                    ),
                    Call::Stat { path } | Call::List { path, .. } | Call::ReadFile { path, .. }
                        if missing(&files, &path) =>
                    {
                        ev(
                            &mut out,
                            id,
                            Event::error(
                                warren_types::ErrorCode::NotFound,
                                format!("{path}: no such file"),
                            ),
                        )
                    }
                    Call::Stat { path } => {
                        let stat = stat(&path, files.lock().unwrap().get(&path));
                        ev(&mut out, id, Event::Stat { stat })
                    }
                    Call::List { path, .. } => ev(
                        &mut out,
                        id,
                        Event::Entries {
                            entries: vec![stat(&path, None)],
                            next: None,
                        },
                    ),
                    Call::ReadFile { path, .. } => {
                        let kept = files.lock().unwrap().get(&path).map(|f| f.data.clone());
                        let data = kept.unwrap_or_else(|| Bytes::from_static(b"hello"));
                        // In frames of 64 KiB, as the agent reads.
                        for at in (0..data.len()).step_by(64 << 10) {
                            let end = (at + (64 << 10)).min(data.len());
                            out.push(Frame::new(id, Kind::Stdout, data.slice(at..end)));
                        }
                        ev(&mut out, id, Event::Done);
                    }
                    Call::WriteFile { path, mode, .. } => {
                        shared.changes.fetch_add(1, Ordering::SeqCst);
                        stdin.insert(id, Vec::new());
                        writes.insert(id, (path, mode));
                    }
                    Call::Mkdir { path, mode, .. } => {
                        shared.changes.fetch_add(1, Ordering::SeqCst);
                        let dir = FakeFile {
                            data: Bytes::new(),
                            mode,
                            dir: true,
                        };
                        files.lock().unwrap().insert(path, dir);
                        ev(&mut out, id, Event::Done)
                    }
                    Call::Kill { pid, signal } => {
                        shared.changes.fetch_add(1, Ordering::SeqCst);
                        shared.kills.lock().unwrap().push((pid, signal));
                        ev(&mut out, id, Event::Done)
                    }
                    Call::Remove { .. } | Call::Chmod { .. } => {
                        shared.changes.fetch_add(1, Ordering::SeqCst);
                        ev(&mut out, id, Event::Done)
                    }
                    Call::Held => ev(&mut out, id, Event::Held { steps: Vec::new() }),
                    Call::Release { .. } => ev(&mut out, id, Event::Done),
                    Call::Pty { spec, cols, rows } => {
                        ptys.insert(id);
                        ev(&mut out, id, Event::Started { pid: 43 });
                        let hello = format!("{} {cols}x{rows}", spec.argv.join(" "));
                        out.push(Frame::new(id, Kind::Stdout, hello));
                    }
                    Call::Collect { .. }
                    | Call::Network { .. }
                    | Call::Invoke { .. }
                    | Call::Connect { .. }
                    | Call::ReadTar { .. }
                    | Call::WriteTar { .. } => ev(
                        &mut out,
                        id,
                        Event::error(warren_types::ErrorCode::InvalidRequest, "not here"),
                    ),
                }
            }
            Kind::Stdin if ptys.contains(&f.stream) => {
                if f.payload.as_ref() == b"exit\r" {
                    ptys.remove(&f.stream);
                    let exit = exit_info(Some(3), None, false, 0, 0);
                    ev(&mut out, f.stream, Event::Exited(exit));
                } else {
                    let mut echo = b"echo:".to_vec();
                    echo.extend_from_slice(&f.payload);
                    out.push(Frame::new(f.stream, Kind::Stdout, echo));
                }
            }
            Kind::Control if ptys.contains(&f.stream) => {
                if let Ok(warren_proto::Control::Resize { cols, rows }) = f.parse() {
                    let msg = format!("resized {cols}x{rows}");
                    out.push(Frame::new(f.stream, Kind::Stdout, msg));
                }
            }
            Kind::Stdin => {
                stdin
                    .entry(f.stream)
                    .or_default()
                    .extend_from_slice(&f.payload);
            }
            Kind::Eof => {
                let data = stdin.remove(&f.stream).unwrap_or_default();
                if let Some(spec) = pending_exec.remove(&f.stream) {
                    finish_exec(&mut out, f.stream, &spec, &data);
                } else {
                    if let Some((path, mode)) = writes.remove(&f.stream) {
                        let file = FakeFile {
                            data: data.into(),
                            mode,
                            dir: false,
                        };
                        files.lock().unwrap().insert(path, file);
                    }
                    ev(&mut out, f.stream, Event::Done);
                }
            }
            _ => {}
        }
        for f in out {
            if frames.send(f).is_err() {
                return;
            }
        }
    }
}

fn finish_exec(out: &mut Vec<Frame>, id: u32, spec: &warren_proto::ExecSpec, stdin: &[u8]) {
    // The hold carries the run's start time: left out, so equal requests echo equally.
    let spec = warren_proto::ExecSpec {
        hold: None,
        ..spec.clone()
    };
    let mut stdout = serde_json::to_vec(&spec).unwrap();
    stdout.extend_from_slice(stdin);
    let stderr: &'static [u8] = if spec.argv.iter().any(|a| a == "raw-stderr") {
        b"err\xff"
    } else {
        b"err"
    };
    // The command's last word (of a shell's command line too).
    let last = spec
        .argv
        .last()
        .and_then(|a| a.split_whitespace().last())
        .unwrap_or("");
    let number = |s: &str| s.parse::<i32>().ok();
    let (code, signal, timed_out) = if let Some(n) = last.strip_prefix("exit:") {
        (number(n), None, false)
    } else if let Some(n) = last.strip_prefix("signal:") {
        (None, number(n), false)
    } else if last == "timeout" {
        (None, Some(9), true)
    } else {
        (Some(3), None, false)
    };
    let exit = exit_info(
        code,
        signal,
        timed_out,
        stdout.len() as u64,
        stderr.len() as u64,
    );
    out.push(Frame::new(id, Kind::Stdout, stdout));
    out.push(Frame::new(id, Kind::Stderr, Bytes::from_static(stderr)));
    out.push(Frame::json(id, Kind::Event, &Event::Exited(exit)));
}

fn exit_info(
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stdout_bytes: u64,
    stderr_bytes: u64,
) -> warren_types::ExitInfo {
    warren_types::ExitInfo {
        exit_code,
        signal,
        timed_out,
        stdout_bytes,
        stderr_bytes,
        stdout_truncated: false,
        stderr_truncated: false,
        duration_us: 1500,
        oom_killed: false,
    }
}

/// A path the agent answers `not_found` for: not kept, and named `missing…`.
fn missing(files: &FakeFiles, path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("missing") && !files.lock().unwrap().contains_key(path)
}

/// What `stat` answers for `path`: the kept file or directory, else a 5-byte file.
fn stat(path: &str, kept: Option<&FakeFile>) -> FileStat {
    FileStat {
        name: path.into(),
        kind: match kept {
            Some(f) if f.dir => FileKind::Dir,
            _ => FileKind::File,
        },
        size: kept.map_or(5, |f| f.data.len() as u64),
        mode: kept.and_then(|f| f.mode).unwrap_or(0o644),
        uid: 0,
        gid: 0,
        mtime_ms: 0,
        link_target: None,
    }
}

/// A sandbox of the fake runtime.
pub struct FakeInstance {
    id: SandboxId,
    agent: AgentConn,
    agent_task: tokio::task::JoinHandle<()>,
    pub destroyed: AtomicBool,
    /// What was written into the sandbox (see [`fake_agent`]).
    pub files: FakeFiles,
    pausable: bool,
    shared: Arc<FakeShared>,
}

impl FakeInstance {
    fn start(id: SandboxId, pausable: bool, shared: Arc<FakeShared>) -> Arc<FakeInstance> {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let files = FakeFiles::default();
        let agent_task = tokio::spawn(fake_agent(theirs, shared.clone(), files.clone()));
        Arc::new(FakeInstance {
            id,
            agent: AgentConn::new(ours),
            agent_task,
            destroyed: AtomicBool::new(false),
            files,
            pausable,
            shared,
        })
    }

    /// The agent dies on its own.
    pub fn kill_agent(&self) {
        self.agent_task.abort();
    }
}

#[async_trait]
impl Instance for FakeInstance {
    fn id(&self) -> &SandboxId {
        &self.id
    }
    fn record(&self) -> serde_json::Value {
        serde_json::json!({"fake": self.id.as_str()})
    }
    fn agent(&self) -> &AgentConn {
        &self.agent
    }
    async fn destroy(&self) -> Result<(), RuntimeError> {
        self.destroyed.store(true, Ordering::SeqCst);
        self.agent_task.abort();
        Ok(())
    }
    async fn lost(&self) {
        self.agent.closed().await
    }
    async fn pause(&self) -> Result<PauseStats, RuntimeError> {
        if !self.pausable {
            return Err(warren_runtime::Unsupported::ThisSubstrate {
                op: warren_runtime::Operation::Pause,
            }
            .into());
        }
        self.shared.pauses.fetch_add(1, Ordering::SeqCst);
        self.shared.paused.lock().unwrap().insert(self.id.clone());
        Ok(PauseStats {
            memory_before_bytes: 1000,
            memory_after_bytes: 100,
            duration_ms: 1.0,
            note: None,
        })
    }
    async fn resume(&self) -> Result<(), RuntimeError> {
        if !self.pausable {
            return Err(warren_runtime::Unsupported::ThisSubstrate {
                op: warren_runtime::Operation::Resume,
            }
            .into());
        }
        self.shared.resumes.fetch_add(1, Ordering::SeqCst);
        self.shared.paused.lock().unwrap().remove(&self.id);
        Ok(())
    }
    fn is_paused(&self) -> bool {
        self.shared.paused.lock().unwrap().contains(&self.id)
    }
    async fn connect_port(&self, port: u16) -> Result<warren_runtime::PortStream, RuntimeError> {
        if port != FAKE_HTTP_PORT {
            return Err(RuntimeError::PortUnreachable {
                port,
                message: format!("nothing listens on port {port} inside the sandbox"),
            });
        }
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(fake_http(theirs));
        Ok(Box::new(ours))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A runtime that records what it was asked to do.
#[derive(Default)]
pub struct FakeRuntime {
    pub fail_create: AtomicBool,
    pub fail_adopt: AtomicBool,
    pub fail_fork: AtomicBool,
    /// Instances made from now on cannot pause (like a substrate without a freezer).
    pub no_pause: AtomicBool,
    pub shared: Arc<FakeShared>,
    /// (parent, children) of every fork.
    pub forked: Mutex<Vec<(SandboxId, Vec<SandboxId>)>>,
    pub created: Mutex<Vec<SandboxSpec>>,
    pub instances: Mutex<Vec<Arc<FakeInstance>>>,
    pub adopted: Mutex<Vec<(SandboxId, serde_json::Value)>>,
    pub destroyed_records: Mutex<Vec<(SandboxId, Option<serde_json::Value>)>>,
    pub reconciled: Mutex<Vec<Vec<SandboxId>>>,
    /// When set, each create takes a permit first (a test holds creates in flight).
    pub create_gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl FakeRuntime {
    pub fn instance(&self, id: &str) -> Arc<FakeInstance> {
        self.instances
            .lock()
            .unwrap()
            .iter()
            .find(|i| i.id.as_str() == id)
            .cloned()
            .expect("instance exists")
    }

    fn start(&self, id: &SandboxId) -> Arc<FakeInstance> {
        let pausable = !self.no_pause.load(Ordering::SeqCst);
        let i = FakeInstance::start(id.clone(), pausable, self.shared.clone());
        self.instances.lock().unwrap().push(i.clone());
        i
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn substrate(&self) -> Substrate {
        Substrate::Container
    }
    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Instance>, RuntimeError> {
        self.created.lock().unwrap().push(spec.clone());
        let gate = self.create_gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        if self.fail_create.load(Ordering::SeqCst) {
            return Err(RuntimeError::StartFailed(
                warren_runtime::StartCause::AgentRefused {
                    message: "fake start failure".into(),
                },
            ));
        }
        Ok(self.start(&spec.id))
    }
    async fn adopt(
        &self,
        spec: &SandboxSpec,
        record: &serde_json::Value,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        self.adopted
            .lock()
            .unwrap()
            .push((spec.id.clone(), record.clone()));
        if self.fail_adopt.load(Ordering::SeqCst) {
            return Err(
                warren_runtime::AdoptError::AgentSocket(std::io::Error::from(
                    std::io::ErrorKind::NotFound,
                ))
                .into(),
            );
        }
        Ok(self.start(&spec.id))
    }
    async fn destroy_record(
        &self,
        id: &SandboxId,
        record: Option<&serde_json::Value>,
    ) -> Result<(), RuntimeError> {
        self.destroyed_records
            .lock()
            .unwrap()
            .push((id.clone(), record.cloned()));
        Ok(())
    }
    async fn reconcile(&self, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError> {
        self.reconciled.lock().unwrap().push(known.to_vec());
        Ok(vec!["cgroup warren-n1/stray".into()])
    }
    async fn fork(
        &self,
        parent: &Arc<dyn Instance>,
        children: &[SandboxSpec],
    ) -> Result<Vec<Arc<dyn Instance>>, RuntimeError> {
        if self.fail_fork.load(Ordering::SeqCst) {
            return Err(RuntimeError::StartFailed(
                warren_runtime::StartCause::AgentRefused {
                    message: "fake fork failure".into(),
                },
            ));
        }
        self.forked.lock().unwrap().push((
            parent.id().clone(),
            children.iter().map(|c| c.id.clone()).collect(),
        ));
        Ok(children
            .iter()
            .map(|c| self.start(&c.id) as Arc<dyn Instance>)
            .collect())
    }
}

/// A manager over a fresh fake runtime with its state in `dir`.
pub fn manager_in(
    dir: &std::path::Path,
    cfg: impl FnOnce(&mut NodeConfig),
) -> (Manager, Arc<FakeRuntime>) {
    let rt = Arc::new(FakeRuntime::default());
    (manager_with(dir, rt.clone(), cfg), rt)
}

/// A manager over `rt` with its state in `dir`.
pub fn manager_with(
    dir: &std::path::Path,
    rt: Arc<FakeRuntime>,
    cfg: impl FnOnce(&mut NodeConfig),
) -> Manager {
    let node: NodeId = "n1".parse().unwrap();
    let mut c = NodeConfig::new(node);
    cfg(&mut c);
    let store = Store::open(dir.join("state.redb")).unwrap();
    Manager::new(c, vec![rt], store)
}

/// Calls on a bare manager as the node's administrator, and the parts above it, for tests
/// that drive one without a node.
#[allow(async_fn_in_trait)]
pub trait Calls {
    /// `POST /v1/sandboxes`, as the node's administrator.
    async fn create(
        &self,
        req: warren_types::CreateSandboxRequest,
    ) -> Result<crate::Created, crate::NodeError>;
    /// `POST /v1/sandboxes/{id}/fork`, as the node's administrator.
    async fn fork(
        &self,
        id: &SandboxId,
        req: warren_types::ForkRequest,
    ) -> Result<Vec<warren_types::SandboxInfo>, crate::NodeError>;
    /// Commands in its sandboxes.
    fn procs(&self) -> crate::manager::Processes;
    /// Files in its sandboxes.
    fn files(&self) -> crate::manager::Files;
    /// The whole log of sandbox `id` from `from_seq` on.
    async fn entries(
        &self,
        id: &SandboxId,
        from_seq: u64,
    ) -> Result<Vec<warren_types::TrajectoryEntry>, crate::NodeError>;
    /// Revives sandbox `id` as `caller`.
    async fn revive(
        &self,
        caller: &warren_types::Caller,
        id: &SandboxId,
        opts: warren_types::ReviveOptions,
    ) -> Result<warren_types::ReviveReport, crate::NodeError>;
}

impl Calls for Manager {
    async fn create(
        &self,
        req: warren_types::CreateSandboxRequest,
    ) -> Result<crate::Created, crate::NodeError> {
        self.create_as(&warren_types::Caller::admin(), req).await
    }

    async fn fork(
        &self,
        id: &SandboxId,
        req: warren_types::ForkRequest,
    ) -> Result<Vec<warren_types::SandboxInfo>, crate::NodeError> {
        self.fork_as(&warren_types::Caller::admin(), id, req).await
    }

    fn procs(&self) -> crate::manager::Processes {
        crate::manager::Processes::new(self.clone())
    }

    fn files(&self) -> crate::manager::Files {
        crate::manager::Files::new(self.clone())
    }

    async fn entries(
        &self,
        id: &SandboxId,
        from_seq: u64,
    ) -> Result<Vec<warren_types::TrajectoryEntry>, crate::NodeError> {
        self.parts().trajectories.entries(self, id, from_seq).await
    }

    async fn revive(
        &self,
        caller: &warren_types::Caller,
        id: &SandboxId,
        opts: warren_types::ReviveOptions,
    ) -> Result<warren_types::ReviveReport, crate::NodeError> {
        self.parts()
            .trajectories
            .revive_as(self, caller, id, opts)
            .await
    }
}

/// The one port of a fake sandbox where an HTTP server listens ([`fake_http`]).
pub const FAKE_HTTP_PORT: u16 = 8000;

/// A one-request HTTP/1.1 server: answers `200` with the request's head (request line and
/// headers, as received) then its body as the answer's body; `GET /upgrade` switches
/// protocols and echoes bytes.
async fn fake_http(mut io: tokio::io::DuplexStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_string();
    if head.starts_with("GET /upgrade ") {
        let _ = io
            .write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n",
            )
            .await;
        loop {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if io.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = got[head_end..].to_vec();
    while body.len() < len {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    let mut answer = head.into_bytes();
    answer.extend_from_slice(&body);
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n\r\n",
        answer.len()
    );
    let _ = io.write_all(reply.as_bytes()).await;
    let _ = io.write_all(&answer).await;
}
