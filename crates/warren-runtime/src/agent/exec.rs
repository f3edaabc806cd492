//! Commands, function calls, background processes, held steps and ports. Every call that
//! returns a finished result ends through the one collector, [`Stream::collect`].

use bytes::Bytes;
use warren_proto::{Call, Event, ExecSpec, HeldStep, InvokeSpec};
use warren_types::{ErrorCode, ProcessInfo};

use super::streams::{no_notes, ExecStream, StdinSink};
use super::{unexpected, AgentConn, CollectedFile, ExecOutput, InvokeOutput, WINDOW};
use crate::RuntimeError;

impl AgentConn {
    /// Runs a command and collects its output (bounded by `spec.output_cap`).
    pub async fn exec(
        &self,
        mut spec: ExecSpec,
        stdin: Option<Bytes>,
    ) -> Result<ExecOutput, RuntimeError> {
        spec.window = None;
        spec.stdin = stdin.is_some();
        let mut s = self.open(&Call::Exec { spec }).await?;
        s.feed(stdin).await?;
        s.collect(no_notes).await?.exited()
    }

    /// Runs one stateless call in a function container. `input` is the files' contents (in
    /// the order of `spec.files`) followed by the command's stdin.
    pub async fn invoke(
        &self,
        mut spec: InvokeSpec,
        input: Bytes,
    ) -> Result<InvokeOutput, RuntimeError> {
        spec.exec.window = None;
        let mut s = self.open(&Call::Invoke { spec }).await?;
        s.feed(Some(input)).await?;
        let (mut files, mut cell_wait_us) = (Vec::new(), 0);
        let out = s
            .collect(|ev| {
                match ev {
                    Event::CellWaited { us } => cell_wait_us = us,
                    Event::Collected {
                        path,
                        data,
                        size,
                        truncated,
                        error,
                    } => files.push(collected_file(path, &data, size, truncated, error)?),
                    ev => return Err(unexpected(&ev)),
                }
                Ok(())
            })
            .await?
            .exited()?;
        Ok(InvokeOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit: out.exit,
            files,
            cell_wait_us,
        })
    }

    /// Runs a command and streams its output.
    pub async fn exec_stream(
        &self,
        mut spec: ExecSpec,
        stdin: Option<Bytes>,
    ) -> Result<ExecStream, RuntimeError> {
        spec.window = Some(WINDOW);
        spec.stdin = stdin.is_some();
        let s = self.open(&Call::Exec { spec }).await?;
        s.feed(stdin).await?;
        Ok(ExecStream::new(s))
    }

    /// Runs a command whose stdin is streamed: write it through the returned [`StdinSink`]
    /// (any size, any bytes) and end it with [`StdinSink::close`]; dropping the sink closes
    /// it too.
    pub async fn exec_piped(
        &self,
        mut spec: ExecSpec,
    ) -> Result<(ExecStream, StdinSink), RuntimeError> {
        spec.window = Some(WINDOW);
        spec.stdin = true;
        let s = self.open(&Call::Exec { spec }).await?;
        let sink = s.stdin_sink();
        Ok((ExecStream::new(s), sink))
    }

    /// Connects to TCP `127.0.0.1:port` inside the sandbox through the agent (see
    /// [`Call::Connect`]): what goes into the sink reaches the port, what it answers comes
    /// out of the stream as stdout, which ends when the port's side closes.
    pub async fn connect_port(&self, port: u16) -> Result<(ExecStream, StdinSink), RuntimeError> {
        let mut s = self
            .open(&Call::Connect {
                port,
                window: WINDOW,
            })
            .await?;
        match s.next_event().await? {
            Event::Connected => {}
            other => return Err(unexpected(&other)),
        }
        let sink = s.stdin_sink();
        Ok((ExecStream::new(s), sink))
    }

    /// Starts a background process and returns its pid inside the sandbox.
    pub async fn spawn(&self, spec: ExecSpec) -> Result<u32, RuntimeError> {
        let mut s = self.open(&Call::Spawn { spec }).await?;
        let ev = s.next_event().await?;
        // `Started` is the last event of a spawn (the process outlives the call).
        s.done = true;
        match ev {
            Event::Started { pid } => Ok(pid),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn list_procs(&self) -> Result<Vec<ProcessInfo>, RuntimeError> {
        match self.simple(Call::ListProcs).await? {
            Event::Procs { procs } => Ok(procs),
            other => Err(unexpected(&other)),
        }
    }

    /// Waits for a background process and returns its kept output.
    pub async fn wait(
        &self,
        pid: u32,
        timeout_ms: Option<u64>,
    ) -> Result<ExecOutput, RuntimeError> {
        let mut s = self.open(&Call::Wait { pid, timeout_ms }).await?;
        s.collect(no_notes).await?.exited()
    }

    /// The agent's held commands (see [`ExecSpec::hold`]). An agent that predates holds
    /// holds nothing.
    pub async fn held(&self) -> Result<Vec<HeldStep>, RuntimeError> {
        match self.simple(Call::Held).await {
            Ok(Event::Held { steps }) => Ok(steps),
            Ok(other) => Err(unexpected(&other)),
            Err(RuntimeError::Agent {
                code: ErrorCode::InvalidRequest,
                ..
            }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The result of held command `step`, once it has ended; true when its run was
    /// disturbed (its stdin cut off when the daemon went away).
    pub async fn collect(&self, step: u64) -> Result<(ExecOutput, bool), RuntimeError> {
        let mut s = self.open(&Call::Collect { step }).await?;
        let out = s.collect(no_notes).await?;
        let (exit, disturbed) = match out.last {
            Event::Exited(exit) => (exit, false),
            Event::HeldExited(exit) => (exit, true),
            ev => return Err(unexpected(&ev)),
        };
        let out = ExecOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit,
        };
        Ok((out, disturbed))
    }

    /// Lets the agent forget held command `step` (its result is logged).
    pub async fn release(&self, step: u64) -> Result<(), RuntimeError> {
        self.simple(Call::Release { step }).await.map(|_| ())
    }

    pub async fn kill(&self, pid: u32, signal: i32) -> Result<(), RuntimeError> {
        self.simple(Call::Kill { pid, signal }).await.map(|_| ())
    }
}

/// A function call's file as the agent sent it (its contents in base64).
fn collected_file(
    path: String,
    data: &str,
    size: u64,
    truncated: bool,
    error: Option<String>,
) -> Result<CollectedFile, RuntimeError> {
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| RuntimeError::Protocol(e.into()))?;
    Ok(CollectedFile {
        path,
        data,
        size,
        truncated,
        error,
    })
}
