//! Commands: one-shot exec, streamed exec, background processes and terminals.
//!
//! The sandbox's defaults are merged here (env: sandbox then request; cwd: request, else the
//! sandbox workdir; user: request, else the sandbox user) into the agent's [`ExecSpec`], and
//! the agent's answers are turned into API results (output as UTF-8 or base64). Exec, streamed
//! exec, spawn and kill go through the step runner (see [`super::runner`]); terminals are
//! logged as they pass (see [`super::terminal`]); listings and waits are not logged.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use warren_proto::ExecSpec;
use warren_runtime::agent::{PtyInput, PtyOutput};
use warren_runtime::{ExecOutput, ExecStream, ExitInfo, StdinSink, StreamItem};
use warren_types::{
    validate, ApiError, ExecEvent, ExecRequest, ExecResult, OutputEncoding, ProcessInfo,
    ProcessState, SandboxId, SandboxInfo, TrajectoryCall,
};

use super::runner::{exec_call, hold, Begun, Fed, Run};
use super::{now_ms, ActivityGuard, Manager};
use crate::error::NodeError;
use crate::metrics::Metrics;
use crate::trajectory::{request_digest, Effect, Exec, Spawn};

/// Default program of a terminal.
pub const DEFAULT_SHELL: &str = "/bin/sh";

/// Longest wait a `wait` call may ask for (7 days).
const MAX_WAIT_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// Builds the agent's command from the request and the sandbox's defaults. The merged
/// command must still be one the kernel can start (see [`validate::command_size`]).
pub(crate) fn exec_spec(info: &SandboxInfo, req: &ExecRequest) -> Result<ExecSpec, NodeError> {
    let mut env = info.env.clone();
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    validate::command_size(&req.command(), &env, validate::MAX_COMMAND_BYTES)?;
    Ok(ExecSpec {
        argv: req.command(),
        cwd: req.cwd.clone().or_else(|| info.workdir.clone()),
        env: env.into_iter().collect(),
        user: req.user.clone().or_else(|| info.user.clone()),
        timeout_ms: req.timeout_secs.map(|t| (t * 1000.0).ceil() as u64),
        output_cap: req.output_cap(),
        stdin: req.stdin.is_some(),
        window: None,
        kill_tree: req.kill_tree,
        hold: None,
    })
}

/// Marks `exit` as an OOM kill when it died of SIGKILL, or exited 137 (how a shell reports a
/// child of its killed by SIGKILL), and the sandbox's OOM killer fired since `before` (its
/// count of OOM kills when the command started). The count now is read (`now`) only then: a
/// command that ended otherwise was not OOM-killed, and the read is a file or more per exec.
pub(crate) fn mark_oom(
    exit: &mut ExitInfo,
    before: Option<u64>,
    now: impl FnOnce() -> Option<u64>,
) {
    if exit.signal == Some(SIGKILL) || exit.exit_code == Some(128 + SIGKILL) {
        if let (Some(a), Some(b)) = (before, now()) {
            exit.oom_killed = b > a;
        }
    }
}

const SIGKILL: i32 = 9;

/// A streamed command: [`ExecEvent`]s as they come, ending with `exit` or `error`.
///
/// A command without a step is driven by its reader: each [`ExecEvents::next`] reads the
/// agent's next chunk, and the exit is logged in the call that returns it (no task, no
/// channel between the command and the answer). Dropping it before the end stops the
/// command at once and logs it as cancelled. A command with a step is driven by its own task
/// and runs on to its end when its reader goes away, so that a retry of the step gets its
/// result.
pub struct ExecEvents {
    id: SandboxId,
    src: Source,
}

enum Source {
    /// Events from a task (a step's command) or a replayed record.
    Channel(mpsc::Receiver<ExecEvent>),
    /// A command driven by the reader; `None` after its last event.
    Inline(Option<Box<(Drive, ExecStream)>>),
}

impl std::fmt::Debug for ExecEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecEvents")
            .field("sandbox", &self.id)
            .finish()
    }
}

impl ExecEvents {
    /// The next event; `None` after the last one. Once the command has ended, the call that
    /// logs it must run to its end (it returns the `exit`): keep it, do not race it.
    pub async fn next(&mut self) -> Option<ExecEvent> {
        match &mut self.src {
            Source::Channel(rx) => rx.recv().await,
            Source::Inline(slot) => {
                let (drive, stream) = &mut **slot.as_mut()?;
                match drive.next(stream).await {
                    Next::Output(ev) => Some(ev),
                    Next::End(outcome) => {
                        let (drive, stream) = *slot.take()?;
                        // The command has ended: nothing to cancel.
                        drop(stream);
                        Some(drive.finish(outcome).await)
                    }
                }
            }
        }
    }

    /// A recorded result, as the events a stream would have sent.
    fn replay(id: SandboxId, mut r: ExecResult) -> ExecEvents {
        let (tx, rx) = mpsc::channel(3);
        let (out, err) = (std::mem::take(&mut r.stdout), std::mem::take(&mut r.stderr));
        if !out.is_empty() {
            let _ = tx.try_send(ExecEvent::Stdout { data: out });
        }
        if !err.is_empty() {
            let _ = tx.try_send(ExecEvent::Stderr { data: err });
        }
        let _ = tx.try_send(ExecEvent::Exit { result: r });
        ExecEvents {
            id,
            src: Source::Channel(rx),
        }
    }
}

impl Drop for ExecEvents {
    fn drop(&mut self) {
        let Source::Inline(slot) = &mut self.src else {
            return;
        };
        let Some(inline) = slot.take() else { return };
        let (drive, stream) = *inline;
        // Stops the command at once (its reader went away); the log entry follows.
        drop(stream);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { drive.run.cancel(drive.call).await });
        }
    }
}

/// Keeps up to `cap` bytes of a stream's output for the log.
fn keep(buf: &mut Vec<u8>, chunk: &[u8], cap: u64, over: &mut bool) {
    let room = (cap as usize).saturating_sub(buf.len());
    if chunk.len() > room {
        *over = true;
    }
    buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
}

/// What a streamed command's next chunk came to.
enum Next {
    Output(ExecEvent),
    /// The command ended (or its stream broke): the outcome to log.
    End(Result<ExecOutput, NodeError>),
}

/// A streamed command on its way: what logging it needs and the output kept so far.
struct Drive {
    manager: Manager,
    id: SandboxId,
    run: Run<Exec>,
    call: TrajectoryCall,
    encoding: OutputEncoding,
    cap: u64,
    instance: Arc<dyn warren_runtime::Instance>,
    substrate: warren_types::Substrate,
    /// The sandbox's OOM kill count when the command started.
    ooms: Option<u64>,
    started: Instant,
    out: Vec<u8>,
    err: Vec<u8>,
    out_over: bool,
    err_over: bool,
    _busy: ActivityGuard,
}

impl Drive {
    /// The events of `stream`: read by the caller, or (a step's command) by a task of its own.
    fn start(self, stream: ExecStream) -> ExecEvents {
        let id = self.id.clone();
        if !self.run.runs_to_end() {
            return ExecEvents {
                id,
                src: Source::Inline(Some(Box::new((self, stream)))),
            };
        }
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.run_to_end(stream, tx));
        ExecEvents {
            id,
            src: Source::Channel(rx),
        }
    }

    /// The next output event of `stream`, or the command's outcome.
    async fn next(&mut self, stream: &mut ExecStream) -> Next {
        let m = self.manager.inner.parts.telemetry.metrics();
        let (data, kind) = match stream.next().await {
            Some(Ok(StreamItem::Stdout(b))) => (b, true),
            Some(Ok(StreamItem::Stderr(b))) => (b, false),
            Some(Ok(StreamItem::Exit(mut exit))) => {
                m.observe_exec(self.substrate, self.started.elapsed());
                exit.stdout_truncated |= self.out_over;
                exit.stderr_truncated |= self.err_over;
                mark_oom(&mut exit, self.ooms, || self.instance.oom_kills());
                return Next::End(Ok(ExecOutput {
                    stdout: std::mem::take(&mut self.out),
                    stderr: std::mem::take(&mut self.err),
                    exit,
                }));
            }
            Some(Err(e)) => {
                Metrics::inc(&m.exec_errors);
                return Next::End(Err(NodeError::runtime(&self.id, e)));
            }
            None => {
                Metrics::inc(&m.exec_errors);
                return Next::End(Err(NodeError::Api(ApiError::new(
                    warren_types::ErrorCode::SandboxLost,
                    "the command's stream ended without an exit",
                ))));
            }
        };
        let data_text = self.encoding.encode(&data);
        if kind {
            keep(&mut self.out, &data, self.cap, &mut self.out_over);
            Next::Output(ExecEvent::Stdout { data: data_text })
        } else {
            keep(&mut self.err, &data, self.cap, &mut self.err_over);
            Next::Output(ExecEvent::Stderr { data: data_text })
        }
    }

    /// Logs the outcome; answers the stream's last event.
    async fn finish(self, outcome: Result<ExecOutput, NodeError>) -> ExecEvent {
        match self.run.finish(self.call, outcome).await {
            Ok(mut r) => {
                // The output went out as it came.
                r.stdout.clear();
                r.stderr.clear();
                ExecEvent::Exit { result: r }
            }
            Err(e) => ExecEvent::Error { error: e.to_api() },
        }
    }

    /// A step's command: driven to its end and logged whether or not anyone reads `tx`.
    async fn run_to_end(mut self, mut stream: ExecStream, tx: mpsc::Sender<ExecEvent>) {
        let mut listening = true;
        let outcome = loop {
            match self.next(&mut stream).await {
                Next::Output(ev) => {
                    if listening && tx.send(ev).await.is_err() {
                        listening = false;
                    }
                }
                Next::End(outcome) => break outcome,
            }
        };
        drop(stream);
        let last = self.finish(outcome).await;
        if listening {
            let _ = tx.send(last).await;
        }
    }
}

/// A terminal: feed [`PtyInput`], read [`PtyOutput`]. Dropping the output half ends the
/// terminal's command.
pub struct TerminalSession {
    pub input: PtyInput,
    pub output: PtyOutput,
    /// Keeps the sandbox marked busy while the terminal is open.
    pub guard: ActivityGuard,
    /// Where what passes through the terminal is reported (logged in the trajectory).
    pub log: super::TerminalLog,
}

impl std::fmt::Debug for TerminalSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalSession").finish_non_exhaustive()
    }
}

/// `GET /v1/sandboxes/{id}/pty` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct PtyRequest {
    pub argv: Vec<String>,
    pub cols: u16,
    pub rows: u16,
    /// Default: the sandbox's workdir.
    pub cwd: Option<String>,
    /// Added to the sandbox's environment.
    pub env: std::collections::BTreeMap<String, String>,
    /// Default: the sandbox's user.
    pub user: Option<String>,
}

/// Commands in the sandboxes of the manager it holds: one-shot, streamed and attached exec,
/// background processes. Owns nothing of its own: every call goes through the manager's
/// step runner. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Processes {
    sandboxes: Manager,
}

impl Processes {
    /// Commands in the sandboxes of `sandboxes`.
    pub fn new(sandboxes: Manager) -> Processes {
        Processes { sandboxes }
    }

    /// A foreground command's request with the node's default timeout when it names none
    /// (applied after the step digest, so a replay does not depend on the node's settings).
    fn with_default_timeout(&self, mut req: ExecRequest) -> ExecRequest {
        if req.timeout_secs.is_none() {
            req.timeout_secs = self.sandboxes.inner.cfg.default_exec_timeout_secs;
        }
        req
    }

    /// `POST /v1/sandboxes/{id}/exec`. With a step, see [`super::runner`].
    pub async fn exec(&self, id: &SandboxId, req: ExecRequest) -> Result<ExecResult, NodeError> {
        req.validate()?;
        let call = TrajectoryCall::Exec(exec_call(&req, false));
        let (m, sid) = (self.sandboxes.clone(), id.clone());
        let step = req.step;
        let logged = call.clone();
        let req = self.with_default_timeout(req);
        let input = req.stdin_bytes()?.map(|b| Fed::Kept(Bytes::from(b)));
        let ran = self
            .sandboxes
            .logged_fed::<Exec, _, _>(id, step, call, input, move |instance, info| async move {
                let mut spec = exec_spec(&info, &req)?;
                spec.hold = hold(step, &logged);
                let stdin = req.stdin_bytes()?.map(Bytes::from);
                let started = Instant::now();
                Metrics::inc(&m.inner.parts.telemetry.metrics().execs);
                let ooms = instance.oom_kills();
                let mut out = instance.agent().exec(spec, stdin).await.map_err(|e| {
                    Metrics::inc(&m.inner.parts.telemetry.metrics().exec_errors);
                    NodeError::runtime(&sid, e)
                })?;
                mark_oom(&mut out.exit, ooms, || instance.oom_kills());
                m.inner
                    .parts
                    .telemetry
                    .metrics()
                    .observe_exec(info.substrate, started.elapsed());
                Ok(out)
            })
            .await?;
        Ok(ran.answer)
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`. Errors before the command starts are returned
    /// here; later ones arrive as the stream's last event. A replayed step sends its recorded
    /// output as one `stdout` and one `stderr` event.
    pub async fn exec_stream(
        &self,
        id: &SandboxId,
        req: ExecRequest,
    ) -> Result<ExecEvents, NodeError> {
        req.validate()?;
        let call = TrajectoryCall::Exec(exec_call(&req, true));
        let digest = request_digest(&call);
        let mut run = match self
            .sandboxes
            .begin::<Exec>(id, req.step, Some(digest))
            .await?
        {
            Begun::Replay(known) => {
                return Ok(ExecEvents::replay(id.clone(), known.answer(&digest)?));
            }
            Begun::Run(run) => run,
        };
        run.digested(digest);
        let req = self.with_default_timeout(req);
        let limit = req.timeout_secs.map(std::time::Duration::from_secs_f64);
        let (instance, info, busy) = run.ready_within(limit).await?;
        let mut spec = exec_spec(&info, &req)?;
        spec.hold = hold(req.step, &call);
        let stdin = req.stdin_bytes()?.map(Bytes::from);
        run.feed(stdin.clone().map(Fed::Kept));
        Metrics::inc(&self.sandboxes.inner.parts.telemetry.metrics().execs);
        let ooms = instance.oom_kills();
        let stream = match instance.agent().exec_stream(spec, stdin).await {
            Ok(s) => s,
            Err(e) => {
                Metrics::inc(&self.sandboxes.inner.parts.telemetry.metrics().exec_errors);
                return Err(run.fail(call, NodeError::runtime(id, e)).await);
            }
        };
        let drive = Drive {
            manager: self.sandboxes.clone(),
            id: id.clone(),
            run,
            call,
            encoding: req.encoding,
            cap: req.output_cap(),
            instance,
            substrate: info.substrate,
            ooms,
            started: Instant::now(),
            out: Vec::new(),
            err: Vec::new(),
            out_over: false,
            err_over: false,
            _busy: busy,
        };
        Ok(drive.start(stream))
    }

    /// `POST /v1/sandboxes/{id}/exec/attach`: a streamed command whose stdin is streamed too,
    /// through the returned sink (any size, any bytes). Its input is not known up front, so it
    /// takes neither inline `stdin` nor a `step`.
    pub async fn exec_attach(
        &self,
        id: &SandboxId,
        req: ExecRequest,
    ) -> Result<(ExecEvents, StdinSink), NodeError> {
        req.validate()?;
        if req.stdin.is_some() || req.step.is_some() {
            return Err(ApiError::invalid(
                "an attached exec streams its stdin in the request body; it takes no `stdin` and no `step`",
            )
            .into());
        }
        let call = TrajectoryCall::Exec(exec_call(&req, true));
        let digest = request_digest(&call);
        let mut run = match self.sandboxes.begin::<Exec>(id, None, Some(digest)).await? {
            Begun::Replay(_) => {
                return Err(ApiError::internal("an exec without a step was replayed").into())
            }
            Begun::Run(run) => run,
        };
        run.digested(digest);
        let req = self.with_default_timeout(req);
        let limit = req.timeout_secs.map(std::time::Duration::from_secs_f64);
        let (instance, info, busy) = run.ready_within(limit).await?;
        let spec = exec_spec(&info, &req)?;
        Metrics::inc(&self.sandboxes.inner.parts.telemetry.metrics().execs);
        let ooms = instance.oom_kills();
        let (stream, sink) = match instance.agent().exec_piped(spec).await {
            Ok(s) => s,
            Err(e) => {
                Metrics::inc(&self.sandboxes.inner.parts.telemetry.metrics().exec_errors);
                return Err(run.fail(call, NodeError::runtime(id, e)).await);
            }
        };
        let drive = Drive {
            manager: self.sandboxes.clone(),
            id: id.clone(),
            run,
            call,
            encoding: req.encoding,
            cap: req.output_cap(),
            instance,
            substrate: info.substrate,
            ooms,
            started: Instant::now(),
            out: Vec::new(),
            err: Vec::new(),
            out_over: false,
            err_over: false,
            _busy: busy,
        };
        Ok((drive.start(stream), sink))
    }

    /// `POST /v1/sandboxes/{id}/processes`. The bool is true when the step was replayed.
    pub async fn spawn(
        &self,
        id: &SandboxId,
        req: ExecRequest,
    ) -> Result<(ProcessInfo, bool), NodeError> {
        req.validate()?;
        if req.stdin.is_some() {
            return Err(ApiError::invalid(
                "background processes take no stdin; upload a file and redirect it",
            )
            .into());
        }
        let call = TrajectoryCall::Spawn(exec_call(&req, false));
        let sid = id.clone();
        let ran = self
            .sandboxes
            .logged::<Spawn, _, _>(id, req.step, call, move |instance, info| async move {
                let spec = exec_spec(&info, &req)?;
                let argv = spec.argv.clone();
                let pid = instance
                    .agent()
                    .spawn(spec)
                    .await
                    .map_err(|e| NodeError::runtime(&sid, e))?;
                Ok(ProcessInfo {
                    pid,
                    argv,
                    state: ProcessState::Running,
                    exit_code: None,
                    signal: None,
                    started_at_ms: now_ms(),
                })
            })
            .await?;
        Ok((ran.answer, ran.replayed))
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn list_procs(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, NodeError> {
        let (instance, _, _guard) = self.sandboxes.ready(id).await?;
        instance
            .agent()
            .list_procs()
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}`.
    pub async fn get_proc(&self, id: &SandboxId, pid: u32) -> Result<ProcessInfo, NodeError> {
        self.list_procs(id)
            .await?
            .into_iter()
            .find(|p| p.pid == pid)
            .ok_or_else(|| {
                ApiError::not_found(format!("no background process {pid} in sandbox {id}")).into()
            })
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/wait`: `timeout` answers `timeout` when the
    /// process is still running then (it keeps running).
    pub async fn wait_proc(
        &self,
        id: &SandboxId,
        pid: u32,
        timeout_secs: Option<f64>,
    ) -> Result<ExecResult, NodeError> {
        if let Some(t) = timeout_secs {
            if !(0.0..=MAX_WAIT_SECS).contains(&t) {
                return Err(ApiError::invalid("timeout_secs must be between 0 and 7 days").into());
            }
        }
        let (instance, _, _guard) = self.sandboxes.ready(id).await?;
        let timeout_ms = timeout_secs.map(|t| (t * 1000.0).ceil() as u64);
        let out = instance
            .agent()
            .wait(pid, timeout_ms)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        Ok(ExecResult::new(
            &out.exit,
            &out.stdout,
            &out.stderr,
            OutputEncoding::Utf8,
        ))
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/kill`. True when the step was replayed.
    pub async fn kill_proc(
        &self,
        id: &SandboxId,
        pid: u32,
        signal: i32,
        step: Option<u64>,
    ) -> Result<bool, NodeError> {
        if !(1..=64).contains(&signal) {
            return Err(ApiError::invalid(format!("signal must be 1-64, got {signal}")).into());
        }
        let call = TrajectoryCall::Kill { pid, signal };
        let sid = id.clone();
        let ran = self
            .sandboxes
            .logged::<Effect, _, _>(id, step, call, move |instance, _| async move {
                instance
                    .agent()
                    .kill(pid, signal)
                    .await
                    .map_err(|e| NodeError::runtime(&sid, e))
            })
            .await?;
        Ok(ran.replayed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_kill_is_marked_for_a_sigkill_or_a_shells_137_only() {
        let ended = |exit_code, signal| ExitInfo {
            exit_code,
            signal,
            ..Default::default()
        };
        let mut e = ended(None, Some(SIGKILL));
        mark_oom(&mut e, Some(1), || Some(2));
        assert!(e.oom_killed, "killed by SIGKILL while the counter rose");
        let mut e = ended(Some(137), None);
        mark_oom(&mut e, Some(1), || Some(2));
        assert!(
            e.oom_killed,
            "a shell's child killed by SIGKILL while the counter rose"
        );
        let mut e = ended(Some(137), None);
        mark_oom(&mut e, Some(2), || Some(2));
        assert!(!e.oom_killed, "no OOM kill in the sandbox");
        let mut e = ended(Some(1), None);
        mark_oom(&mut e, Some(1), || panic!("not read for an ordinary exit"));
        assert!(!e.oom_killed);
    }
}
