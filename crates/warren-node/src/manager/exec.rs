//! Commands: one-shot exec, streamed exec, background processes and terminals.
//!
//! The sandbox's defaults are merged here (env: sandbox then request; cwd: request, else the
//! sandbox workdir; user: request, else the sandbox user) into the agent's [`ExecSpec`], and
//! the agent's answers are turned into API results (output as UTF-8 or base64).

use base64::Engine;
use bytes::Bytes;
use std::time::Instant;
use warren_proto::ExecSpec;
use warren_runtime::agent::{PtyInput, PtyOutput};
use warren_runtime::{ExecOutput, ExecStream, ExitInfo, StreamItem};
use warren_types::{
    ApiError, ExecEvent, ExecRequest, ExecResult, OutputEncoding, ProcessInfo, ProcessState,
    SandboxId, SandboxInfo,
};

use super::{now_ms, ActivityGuard, Manager};
use crate::error::NodeError;
use crate::metrics::Metrics;

/// Default program of a terminal.
pub const DEFAULT_SHELL: &str = "/bin/sh";

/// Longest wait a `wait` call may ask for (7 days).
const MAX_WAIT_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// Builds the agent's command from the request and the sandbox's defaults.
pub(crate) fn exec_spec(info: &SandboxInfo, req: &ExecRequest) -> ExecSpec {
    let mut env = info.env.clone();
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    ExecSpec {
        argv: req.command(),
        cwd: req.cwd.clone().or_else(|| info.workdir.clone()),
        env: env.into_iter().collect(),
        user: req.user.clone().or_else(|| info.user.clone()),
        timeout_ms: req.timeout_secs.map(|t| (t * 1000.0).ceil() as u64),
        output_cap: req.output_cap(),
        stdin: req.stdin.is_some(),
        window: None,
    }
}

/// Output bytes as the request asked for them.
pub(crate) fn encode(bytes: &[u8], encoding: OutputEncoding) -> String {
    match encoding {
        OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

/// The API result of a finished command.
pub(crate) fn exec_result(
    stdout: &[u8],
    stderr: &[u8],
    exit: &ExitInfo,
    encoding: OutputEncoding,
) -> ExecResult {
    ExecResult {
        exit_code: exit.exit_code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        stdout: encode(stdout, encoding),
        stderr: encode(stderr, encoding),
        stdout_truncated: exit.stdout_truncated,
        stderr_truncated: exit.stderr_truncated,
        stdout_bytes: exit.stdout_bytes,
        stderr_bytes: exit.stderr_bytes,
        encoding,
        duration_ms: exit.duration_us as f64 / 1000.0,
    }
}

fn output_result(out: &ExecOutput, encoding: OutputEncoding) -> ExecResult {
    exec_result(&out.stdout, &out.stderr, &out.exit, encoding)
}

/// A streamed command: [`ExecEvent`]s as they come, ending with `exit` or `error`.
/// Dropping it before the end kills the command.
pub struct ExecEvents {
    stream: ExecStream,
    encoding: OutputEncoding,
    started: Instant,
    manager: Manager,
    id: SandboxId,
    done: bool,
    _guard: ActivityGuard,
}

impl std::fmt::Debug for ExecEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecEvents")
            .field("sandbox", &self.id)
            .field("done", &self.done)
            .finish()
    }
}

impl ExecEvents {
    /// The next event; `None` after the last one.
    pub async fn next(&mut self) -> Option<ExecEvent> {
        if self.done {
            return None;
        }
        let item = self.stream.next().await;
        let m = &self.manager.inner.metrics;
        match item {
            Some(Ok(StreamItem::Stdout(b))) => Some(ExecEvent::Stdout {
                data: encode(&b, self.encoding),
            }),
            Some(Ok(StreamItem::Stderr(b))) => Some(ExecEvent::Stderr {
                data: encode(&b, self.encoding),
            }),
            Some(Ok(StreamItem::Exit(exit))) => {
                self.done = true;
                m.observe_exec(self.started.elapsed());
                Some(ExecEvent::Exit {
                    result: exec_result(&[], &[], &exit, self.encoding),
                })
            }
            Some(Err(e)) => {
                self.done = true;
                Metrics::inc(&m.exec_errors);
                Some(ExecEvent::Error {
                    error: NodeError::runtime(&self.id, e).to_api(),
                })
            }
            None => {
                self.done = true;
                Metrics::inc(&m.exec_errors);
                Some(ExecEvent::Error {
                    error: ApiError::new(
                        warren_types::ErrorCode::SandboxLost,
                        "the command's stream ended without an exit",
                    ),
                })
            }
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
}

impl Manager {
    /// `POST /v1/sandboxes/{id}/exec`.
    pub async fn exec(&self, id: &SandboxId, req: ExecRequest) -> Result<ExecResult, NodeError> {
        req.validate()?;
        let (instance, info, _guard) = self.running(id)?;
        let spec = exec_spec(&info, &req);
        let stdin = req.stdin.map(Bytes::from);
        let started = Instant::now();
        Metrics::inc(&self.inner.metrics.execs);
        let out = instance.agent().exec(spec, stdin).await.map_err(|e| {
            Metrics::inc(&self.inner.metrics.exec_errors);
            NodeError::runtime(id, e)
        })?;
        self.inner.metrics.observe_exec(started.elapsed());
        Ok(output_result(&out, req.encoding))
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`. Errors before the command starts are returned
    /// here; later ones arrive as the stream's last event.
    pub async fn exec_stream(
        &self,
        id: &SandboxId,
        req: ExecRequest,
    ) -> Result<ExecEvents, NodeError> {
        req.validate()?;
        let (instance, info, guard) = self.running(id)?;
        let spec = exec_spec(&info, &req);
        let stdin = req.stdin.map(Bytes::from);
        Metrics::inc(&self.inner.metrics.execs);
        let stream = instance
            .agent()
            .exec_stream(spec, stdin)
            .await
            .map_err(|e| {
                Metrics::inc(&self.inner.metrics.exec_errors);
                NodeError::runtime(id, e)
            })?;
        Ok(ExecEvents {
            stream,
            encoding: req.encoding,
            started: Instant::now(),
            manager: self.clone(),
            id: id.clone(),
            done: false,
            _guard: guard,
        })
    }

    /// `POST /v1/sandboxes/{id}/processes`.
    pub async fn spawn(&self, id: &SandboxId, req: ExecRequest) -> Result<ProcessInfo, NodeError> {
        req.validate()?;
        if req.stdin.is_some() {
            return Err(ApiError::invalid(
                "background processes take no stdin; upload a file and redirect it",
            )
            .into());
        }
        let (instance, info, _guard) = self.running(id)?;
        let spec = exec_spec(&info, &req);
        let argv = spec.argv.clone();
        let pid = instance
            .agent()
            .spawn(spec)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        Ok(ProcessInfo {
            pid,
            argv,
            state: ProcessState::Running,
            exit_code: None,
            signal: None,
            started_at_ms: now_ms(),
        })
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn list_procs(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, NodeError> {
        let (instance, _, _guard) = self.running(id)?;
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
        let (instance, _, _guard) = self.running(id)?;
        let timeout_ms = timeout_secs.map(|t| (t * 1000.0).ceil() as u64);
        let out = instance
            .agent()
            .wait(pid, timeout_ms)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        Ok(output_result(&out, OutputEncoding::Utf8))
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/kill`.
    pub async fn kill_proc(&self, id: &SandboxId, pid: u32, signal: i32) -> Result<(), NodeError> {
        if !(1..=64).contains(&signal) {
            return Err(ApiError::invalid(format!("signal must be 1-64, got {signal}")).into());
        }
        let (instance, _, _guard) = self.running(id)?;
        instance
            .agent()
            .kill(pid, signal)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `GET /v1/sandboxes/{id}/pty`: starts a terminal.
    pub async fn pty(&self, id: &SandboxId, req: PtyRequest) -> Result<TerminalSession, NodeError> {
        let exec = ExecRequest {
            argv: Some(req.argv),
            ..Default::default()
        };
        exec.validate()?;
        if req.cols == 0 || req.rows == 0 {
            return Err(ApiError::invalid("cols and rows must be at least 1").into());
        }
        let (instance, info, guard) = self.running(id)?;
        let mut spec = exec_spec(&info, &exec);
        if !spec.env.iter().any(|(k, _)| k == "TERM") {
            spec.env.push(("TERM".into(), "xterm-256color".into()));
        }
        let session = instance
            .agent()
            .pty(spec, req.cols, req.rows)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        let (input, output) = session.split();
        Ok(TerminalSession {
            input,
            output,
            guard,
        })
    }
}
