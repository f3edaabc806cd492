//! The daemon's side of the agent protocol: one multiplexed connection per sandbox.
//!
//! Transport-agnostic: anything that is a connected unix stream (a socketpair for containers,
//! a chardev socket of a VMM for VMs). Each call opens a stream; the reader task routes the
//! agent's frames to the stream's channel. Output-heavy streams run with a credit window that
//! is only topped up as the consumer takes data, so a slow HTTP client or a `yes` flood never
//! grows the daemon's memory beyond the window.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use warren_proto::{Call, Event, ExecSpec, Frame, InvokeSpec, Kind, MAX_PAYLOAD};
use warren_types::{ErrorCode, FileStat, ProcessInfo};

use crate::RuntimeError;

mod pty;
pub use pty::{PtyInput, PtyOutput, PtySession};

/// Output window of streamed calls.
const WINDOW: u32 = 512 * 1024;

pub use warren_types::ExitInfo;

/// A finished command with its captured output.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: ExitInfo,
}

/// A file read back after a function call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectedFile {
    pub path: String,
    pub data: Vec<u8>,
    /// Its full size (more than `data` when truncated).
    pub size: u64,
    pub truncated: bool,
    /// Why it could not be read (`not found`, ...).
    pub error: Option<String>,
}

/// A finished function call.
#[derive(Debug, Clone, Default)]
pub struct InvokeOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: ExitInfo,
    pub files: Vec<CollectedFile>,
    /// How long the call waited in the container for its call environment.
    pub cell_wait_us: u64,
}

/// One item of a streamed command or terminal.
#[derive(Debug, Clone)]
pub enum StreamItem {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExitInfo),
}

struct Inner {
    tx: mpsc::Sender<Frame>,
    streams: Mutex<HashMap<u32, mpsc::UnboundedSender<Frame>>>,
    next: AtomicU32,
    closed: watch::Receiver<bool>,
}

/// A connection to one agent. Cheap to clone.
#[derive(Clone)]
pub struct AgentConn {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AgentConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConn")
            .field("closed", &self.is_closed())
            .finish()
    }
}

fn from_event_error(code: ErrorCode, message: String) -> RuntimeError {
    RuntimeError::Agent { code, message }
}

fn exit_info(ev: &Event) -> Option<ExitInfo> {
    match ev {
        Event::Exited(exit) => Some(*exit),
        _ => None,
    }
}

impl AgentConn {
    /// Starts serving a connected stream whose start-up handshake is done.
    pub fn new(stream: UnixStream) -> Self {
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<Frame>(1024);
        let (closed_tx, closed) = watch::channel(false);
        let inner = Arc::new(Inner {
            tx,
            streams: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            closed,
        });
        tokio::spawn(async move {
            let mut buf = bytes::BytesMut::with_capacity(1 << 16);
            while let Some(f) = rx.recv().await {
                buf.clear();
                f.encode_into(&mut buf);
                while buf.len() < (1 << 20) {
                    match rx.try_recv() {
                        Ok(f) => f.encode_into(&mut buf),
                        Err(_) => break,
                    }
                }
                if wr.write_all(&buf).await.is_err() {
                    return;
                }
            }
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Ok(frame) = Frame::read_async(&mut rd).await {
                let Some(inner) = weak.upgrade() else { break };
                let tx = inner
                    .streams
                    .lock()
                    .expect("streams lock")
                    .get(&frame.stream)
                    .cloned();
                if let Some(tx) = tx {
                    let _ = tx.send(frame);
                }
            }
            if let Some(inner) = weak.upgrade() {
                inner.streams.lock().expect("streams lock").clear();
            }
            let _ = closed_tx.send(true);
        });
        AgentConn { inner }
    }

    /// True once the connection is gone.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Resolves when the connection is gone.
    pub async fn closed(&self) {
        let mut rx = self.inner.closed.clone();
        let _ = rx.wait_for(|c| *c).await;
    }

    async fn open(&self, call: &Call) -> Result<Stream, RuntimeError> {
        if self.is_closed() {
            return Err(RuntimeError::AgentLost);
        }
        let frame = Frame::json(0, Kind::Call, call);
        if !frame.fits() {
            // Never sent: the agent's connection outlives any request.
            return Err(RuntimeError::Agent {
                code: ErrorCode::InvalidRequest,
                message: format!(
                    "the request is {} bytes encoded, more than the {} bytes a call may carry",
                    frame.payload.len(),
                    warren_proto::MAX_MESSAGE
                ),
            });
        }
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed).max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .streams
            .lock()
            .expect("streams lock")
            .insert(id, tx);
        let s = Stream {
            id,
            rx,
            conn: self.clone(),
            done: false,
        };
        s.send(Frame::new(id, Kind::Call, frame.payload)).await?;
        Ok(s)
    }

    async fn simple(&self, call: Call) -> Result<Event, RuntimeError> {
        let mut s = self.open(&call).await?;
        loop {
            match s.next_frame().await? {
                f if f.kind == Kind::Event => {
                    let ev: Event = f
                        .parse()
                        .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
                    if ev.is_final() {
                        s.done = true;
                        return match ev {
                            Event::Error { code, message } => Err(from_event_error(code, message)),
                            ev => Ok(ev),
                        };
                    }
                }
                _ => {}
            }
        }
    }

    /// Round trip to the agent.
    pub async fn ping(&self) -> Result<u32, RuntimeError> {
        match self.simple(Call::Ping).await? {
            Event::Pong { pid, .. } => Ok(pid),
            other => Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
        }
    }

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
        let mut out = ExecOutput::default();
        loop {
            let f = s.next_frame().await?;
            match f.kind {
                Kind::Stdout => out.stdout.extend_from_slice(&f.payload),
                Kind::Stderr => out.stderr.extend_from_slice(&f.payload),
                Kind::Event => match f
                    .parse::<Event>()
                    .map_err(|e| RuntimeError::Protocol(e.to_string()))?
                {
                    Event::Started { .. } => {}
                    Event::Error { code, message } => {
                        s.done = true;
                        return Err(from_event_error(code, message));
                    }
                    ev => {
                        s.done = true;
                        out.exit = exit_info(&ev)
                            .ok_or_else(|| RuntimeError::Protocol(format!("unexpected {ev:?}")))?;
                        return Ok(out);
                    }
                },
                _ => {}
            }
        }
    }

    /// Runs one stateless call in a function container. `input` is the files' contents (in
    /// the order of `spec.files`) followed by the command's stdin.
    pub async fn invoke(
        &self,
        mut spec: InvokeSpec,
        input: Bytes,
    ) -> Result<InvokeOutput, RuntimeError> {
        use base64::Engine;
        spec.exec.window = None;
        let mut s = self.open(&Call::Invoke { spec }).await?;
        s.feed(Some(input)).await?;
        let mut out = InvokeOutput::default();
        loop {
            let f = s.next_frame().await?;
            match f.kind {
                Kind::Stdout => out.stdout.extend_from_slice(&f.payload),
                Kind::Stderr => out.stderr.extend_from_slice(&f.payload),
                Kind::Event => match f
                    .parse::<Event>()
                    .map_err(|e| RuntimeError::Protocol(e.to_string()))?
                {
                    Event::Started { .. } => {}
                    Event::CellWaited { us } => out.cell_wait_us = us,
                    Event::Collected {
                        path,
                        data,
                        size,
                        truncated,
                        error,
                    } => out.files.push(CollectedFile {
                        path,
                        data: base64::engine::general_purpose::STANDARD
                            .decode(data)
                            .map_err(|e| RuntimeError::Protocol(e.to_string()))?,
                        size,
                        truncated,
                        error,
                    }),
                    Event::Error { code, message } => {
                        s.done = true;
                        return Err(from_event_error(code, message));
                    }
                    ev => {
                        s.done = true;
                        out.exit = exit_info(&ev)
                            .ok_or_else(|| RuntimeError::Protocol(format!("unexpected {ev:?}")))?;
                        return Ok(out);
                    }
                },
                _ => {}
            }
        }
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
        Ok(ExecStream { s, owed: 0 })
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
        let sink = StdinSink {
            id: s.id,
            conn: self.clone(),
            closed: false,
        };
        Ok((ExecStream { s, owed: 0 }, sink))
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
        loop {
            let f = s.next_frame().await?;
            if f.kind != Kind::Event {
                continue;
            }
            match f
                .parse::<Event>()
                .map_err(|e| RuntimeError::Protocol(e.to_string()))?
            {
                Event::Connected => break,
                Event::Error { code, message } => {
                    s.done = true;
                    return Err(from_event_error(code, message));
                }
                other => return Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
            }
        }
        let sink = StdinSink {
            id: s.id,
            conn: self.clone(),
            closed: false,
        };
        Ok((ExecStream { s, owed: 0 }, sink))
    }

    /// Starts a background process and returns its pid inside the sandbox.
    pub async fn spawn(&self, spec: ExecSpec) -> Result<u32, RuntimeError> {
        // `Started` is the last event of a spawn (the process outlives the call).
        let mut s = self.open(&Call::Spawn { spec }).await?;
        loop {
            let f = s.next_frame().await?;
            if f.kind != Kind::Event {
                continue;
            }
            s.done = true;
            return match f
                .parse::<Event>()
                .map_err(|e| RuntimeError::Protocol(e.to_string()))?
            {
                Event::Started { pid } => Ok(pid),
                Event::Error { code, message } => Err(from_event_error(code, message)),
                other => Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
            };
        }
    }

    pub async fn list_procs(&self) -> Result<Vec<ProcessInfo>, RuntimeError> {
        match self.simple(Call::ListProcs).await? {
            Event::Procs { procs } => Ok(procs),
            other => Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// Waits for a background process and returns its kept output.
    pub async fn wait(
        &self,
        pid: u32,
        timeout_ms: Option<u64>,
    ) -> Result<ExecOutput, RuntimeError> {
        let mut s = self.open(&Call::Wait { pid, timeout_ms }).await?;
        let mut out = ExecOutput::default();
        loop {
            let f = s.next_frame().await?;
            match f.kind {
                Kind::Stdout => out.stdout.extend_from_slice(&f.payload),
                Kind::Stderr => out.stderr.extend_from_slice(&f.payload),
                Kind::Event => {
                    s.done = true;
                    return match f
                        .parse::<Event>()
                        .map_err(|e| RuntimeError::Protocol(e.to_string()))?
                    {
                        Event::Error { code, message } => Err(from_event_error(code, message)),
                        ev => {
                            out.exit = exit_info(&ev).ok_or_else(|| {
                                RuntimeError::Protocol(format!("unexpected {ev:?}"))
                            })?;
                            Ok(out)
                        }
                    };
                }
                _ => {}
            }
        }
    }

    /// The agent's held commands (see [`ExecSpec::hold`]). An agent that predates holds
    /// holds nothing.
    pub async fn held(&self) -> Result<Vec<warren_proto::HeldStep>, RuntimeError> {
        match self.simple(Call::Held).await {
            Ok(Event::Held { steps }) => Ok(steps),
            Ok(other) => Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
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
        let mut out = ExecOutput::default();
        loop {
            let f = s.next_frame().await?;
            match f.kind {
                Kind::Stdout => out.stdout.extend_from_slice(&f.payload),
                Kind::Stderr => out.stderr.extend_from_slice(&f.payload),
                Kind::Event => {
                    s.done = true;
                    return match f
                        .parse::<Event>()
                        .map_err(|e| RuntimeError::Protocol(e.to_string()))?
                    {
                        Event::Error { code, message } => Err(from_event_error(code, message)),
                        Event::Exited(exit) => {
                            out.exit = exit;
                            Ok((out, false))
                        }
                        Event::HeldExited(exit) => {
                            out.exit = exit;
                            Ok((out, true))
                        }
                        ev => Err(RuntimeError::Protocol(format!("unexpected {ev:?}"))),
                    };
                }
                _ => {}
            }
        }
    }

    /// Lets the agent forget held command `step` (its result is logged).
    pub async fn release(&self, step: u64) -> Result<(), RuntimeError> {
        self.simple(Call::Release { step }).await.map(|_| ())
    }

    pub async fn kill(&self, pid: u32, signal: i32) -> Result<(), RuntimeError> {
        self.simple(Call::Kill { pid, signal }).await.map(|_| ())
    }

    /// Opens a terminal running `spec`.
    pub async fn pty(
        &self,
        mut spec: ExecSpec,
        cols: u16,
        rows: u16,
    ) -> Result<PtySession, RuntimeError> {
        spec.window = Some(WINDOW);
        let mut s = self.open(&Call::Pty { spec, cols, rows }).await?;
        // Wait for Started (or an error) so callers learn about bad commands at once.
        loop {
            let f = s.next_frame().await?;
            if f.kind == Kind::Event {
                match f
                    .parse::<Event>()
                    .map_err(|e| RuntimeError::Protocol(e.to_string()))?
                {
                    Event::Started { .. } => break,
                    Event::Error { code, message } => {
                        s.done = true;
                        return Err(from_event_error(code, message));
                    }
                    other => return Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
                }
            }
        }
        Ok(PtySession { s })
    }

    /// Streams a file out of the sandbox.
    pub async fn read_file(&self, path: &str) -> Result<FileReader, RuntimeError> {
        self.reader(Call::ReadFile {
            path: path.to_string(),
            window: WINDOW,
        })
        .await
    }

    /// Streams a directory tree (or one file) out of the sandbox as a tar stream.
    pub async fn read_tar(&self, path: &str) -> Result<FileReader, RuntimeError> {
        self.reader(Call::ReadTar {
            path: path.to_string(),
            window: WINDOW,
        })
        .await
    }

    async fn reader(&self, call: Call) -> Result<FileReader, RuntimeError> {
        let mut s = self.open(&call).await?;
        // Fail early (not found, not a file) before the caller commits to a 200 response.
        let first = s.next_frame().await?;
        let pending = match first.kind {
            Kind::Event => match first
                .parse::<Event>()
                .map_err(|e| RuntimeError::Protocol(e.to_string()))?
            {
                Event::Error { code, message } => {
                    s.done = true;
                    return Err(from_event_error(code, message));
                }
                _ => {
                    s.done = true;
                    None
                }
            },
            _ => Some(first.payload),
        };
        Ok(FileReader { s, pending })
    }

    /// Replaces a file (see [`Call::WriteFile`]); write chunks, then `finish`.
    pub async fn write_file(
        &self,
        path: &str,
        mode: Option<u32>,
        size: Option<u64>,
    ) -> Result<FileWriter, RuntimeError> {
        let s = self
            .open(&Call::WriteFile {
                path: path.to_string(),
                mode,
                size,
            })
            .await?;
        Ok(FileWriter { s })
    }

    /// Unpacks a tar stream under a directory of the sandbox (made when missing); write its
    /// chunks, then `finish`.
    pub async fn write_tar(&self, path: &str) -> Result<FileWriter, RuntimeError> {
        let s = self
            .open(&Call::WriteTar {
                path: path.to_string(),
            })
            .await?;
        Ok(FileWriter { s })
    }

    pub async fn stat(&self, path: &str) -> Result<FileStat, RuntimeError> {
        match self
            .simple(Call::Stat {
                path: path.to_string(),
            })
            .await?
        {
            Event::Stat { stat } => Ok(stat),
            other => Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// One page of a directory (see [`Call::List`]); the name to continue after, if any.
    pub async fn list(
        &self,
        path: &str,
        after: Option<&str>,
        limit: Option<u32>,
    ) -> Result<(Vec<FileStat>, Option<String>), RuntimeError> {
        match self
            .simple(Call::List {
                path: path.to_string(),
                after: after.map(String::from),
                limit,
            })
            .await?
        {
            Event::Entries { entries, next } => Ok((entries, next)),
            other => Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    pub async fn mkdir(
        &self,
        path: &str,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<(), RuntimeError> {
        self.simple(Call::Mkdir {
            path: path.to_string(),
            parents,
            mode,
        })
        .await
        .map(|_| ())
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), RuntimeError> {
        self.simple(Call::Remove {
            path: path.to_string(),
            recursive,
        })
        .await
        .map(|_| ())
    }

    pub async fn chmod(&self, path: &str, mode: u32) -> Result<(), RuntimeError> {
        self.simple(Call::Chmod {
            path: path.to_string(),
            mode,
        })
        .await
        .map(|_| ())
    }

    /// Configures a VM guest's network interface (`None` takes its address away) and writes
    /// its `/etc/resolv.conf`.
    pub async fn guest_network(
        &self,
        config: Option<warren_proto::GuestNet>,
        resolv_conf: String,
    ) -> Result<(), RuntimeError> {
        self.simple(Call::Network {
            config,
            resolv_conf: Some(resolv_conf),
        })
        .await
        .map(|_| ())
    }
}

/// One open stream. Dropping it before the agent finished cancels the work.
struct Stream {
    id: u32,
    rx: mpsc::UnboundedReceiver<Frame>,
    conn: AgentConn,
    done: bool,
}

impl Stream {
    async fn send(&self, f: Frame) -> Result<(), RuntimeError> {
        self.conn
            .inner
            .tx
            .send(f)
            .await
            .map_err(|_| RuntimeError::AgentLost)
    }

    async fn next_frame(&mut self) -> Result<Frame, RuntimeError> {
        self.rx.recv().await.ok_or(RuntimeError::AgentLost)
    }

    async fn feed(&self, data: Option<Bytes>) -> Result<(), RuntimeError> {
        if let Some(data) = data {
            let mut off = 0;
            while off < data.len() {
                let end = (off + MAX_PAYLOAD).min(data.len());
                self.send(Frame::new(self.id, Kind::Stdin, data.slice(off..end)))
                    .await?;
                off = end;
            }
            self.send(Frame::new(self.id, Kind::Eof, Bytes::new()))
                .await?;
        }
        Ok(())
    }
}

/// What an output stream yields next.
enum Output {
    Data(Kind, Bytes),
    /// The stream's last event (not `Error`, which is returned as `Err`).
    Final(Event),
}

impl Stream {
    /// The next STDOUT/STDERR chunk or the final event, skipping `Started`. Marks the stream
    /// done when it ends, by final event or error; `None` once done.
    async fn next_output(&mut self) -> Option<Result<Output, RuntimeError>> {
        if self.done {
            return None;
        }
        loop {
            let f = match self.next_frame().await {
                Ok(f) => f,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            match f.kind {
                Kind::Stdout | Kind::Stderr => return Some(Ok(Output::Data(f.kind, f.payload))),
                Kind::Event => match f.parse::<Event>() {
                    Ok(Event::Started { .. }) => {}
                    Ok(Event::Error { code, message }) => {
                        self.done = true;
                        return Some(Err(from_event_error(code, message)));
                    }
                    Ok(ev) => {
                        self.done = true;
                        return Some(Ok(Output::Final(ev)));
                    }
                    Err(e) => {
                        self.done = true;
                        return Some(Err(RuntimeError::Protocol(e.to_string())));
                    }
                },
                _ => {}
            }
        }
    }

    /// Lets the agent send `n` more bytes on this stream.
    async fn credit(&self, n: usize) {
        let _ = self.send(Frame::credit(self.id, n as u32)).await;
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.conn
            .inner
            .streams
            .lock()
            .expect("streams lock")
            .remove(&self.id);
        if !self.done {
            let _ = self
                .conn
                .inner
                .tx
                .try_send(Frame::new(self.id, Kind::Cancel, Bytes::new()));
        }
    }
}

/// A command's output as it comes.
pub struct ExecStream {
    s: Stream,
    owed: u32,
}

impl ExecStream {
    /// The next chunk or the exit; `None` after the exit.
    pub async fn next(&mut self) -> Option<Result<StreamItem, RuntimeError>> {
        // Credit for the previous chunk is granted only now that the consumer asks for more.
        if self.owed > 0 && !self.s.done {
            self.s.credit(self.owed as usize).await;
            self.owed = 0;
        }
        match self.s.next_output().await? {
            Ok(Output::Data(kind, data)) => {
                self.owed = data.len() as u32;
                Some(Ok(if kind == Kind::Stderr {
                    StreamItem::Stderr(data)
                } else {
                    StreamItem::Stdout(data)
                }))
            }
            Ok(Output::Final(ev)) => exit_info(&ev).map(|e| Ok(StreamItem::Exit(e))),
            Err(e) => Some(Err(e)),
        }
    }

    /// Stops the command (kills its process tree).
    pub async fn cancel(mut self) {
        let _ = self
            .s
            .send(Frame::new(self.s.id, Kind::Cancel, Bytes::new()))
            .await;
        self.s.done = true;
    }
}

/// The stdin of a command started by [`AgentConn::exec_piped`].
pub struct StdinSink {
    id: u32,
    conn: AgentConn,
    closed: bool,
}

impl StdinSink {
    /// Sends a chunk (any size; split into frames).
    pub async fn write(&mut self, data: Bytes) -> Result<(), RuntimeError> {
        let mut off = 0;
        while off < data.len() {
            let end = (off + MAX_PAYLOAD).min(data.len());
            self.send(Frame::new(self.id, Kind::Stdin, data.slice(off..end)))
                .await?;
            off = end;
        }
        Ok(())
    }

    /// Ends the command's stdin.
    pub async fn close(mut self) -> Result<(), RuntimeError> {
        self.closed = true;
        self.send(Frame::new(self.id, Kind::Eof, Bytes::new()))
            .await
    }

    async fn send(&self, f: Frame) -> Result<(), RuntimeError> {
        self.conn
            .inner
            .tx
            .send(f)
            .await
            .map_err(|_| RuntimeError::AgentLost)
    }
}

impl Drop for StdinSink {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let eof = Frame::new(self.id, Kind::Eof, Bytes::new());
        if let Err(mpsc::error::TrySendError::Full(eof)) = self.conn.inner.tx.try_send(eof) {
            // The command must see its end of input even when the writer is backed up.
            let tx = self.conn.inner.tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(eof).await;
            });
        }
    }
}

/// A file streaming out of the sandbox.
pub struct FileReader {
    s: Stream,
    pending: Option<Bytes>,
}

impl FileReader {
    /// The next chunk; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes, RuntimeError>> {
        if let Some(p) = self.pending.take() {
            self.s.credit(p.len()).await;
            return Some(Ok(p));
        }
        loop {
            match self.s.next_output().await? {
                Ok(Output::Data(Kind::Stdout, data)) => {
                    self.s.credit(data.len()).await;
                    return Some(Ok(data));
                }
                Ok(Output::Data(..)) => {}
                Ok(Output::Final(_)) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// A file streaming into the sandbox.
pub struct FileWriter {
    s: Stream,
}

impl FileWriter {
    /// Writes a chunk (any size; split into frames).
    pub async fn write(&mut self, data: Bytes) -> Result<(), RuntimeError> {
        // An early error (disk full, permission) ends the upload at once.
        if let Ok(f) = self.s.rx.try_recv() {
            if f.kind == Kind::Event {
                self.s.done = true;
                return match f.parse::<Event>() {
                    Ok(Event::Error { code, message }) => Err(from_event_error(code, message)),
                    _ => Err(RuntimeError::Protocol("write ended early".into())),
                };
            }
        }
        let mut off = 0;
        while off < data.len() {
            let end = (off + MAX_PAYLOAD).min(data.len());
            self.s
                .send(Frame::new(self.s.id, Kind::Stdin, data.slice(off..end)))
                .await?;
            off = end;
        }
        Ok(())
    }

    /// Ends the upload and waits for the agent's verdict.
    pub async fn finish(mut self) -> Result<(), RuntimeError> {
        self.s
            .send(Frame::new(self.s.id, Kind::Eof, Bytes::new()))
            .await?;
        loop {
            let f = self.s.next_frame().await?;
            if f.kind == Kind::Event {
                self.s.done = true;
                return match f
                    .parse::<Event>()
                    .map_err(|e| RuntimeError::Protocol(e.to_string()))?
                {
                    Event::Error { code, message } => Err(from_event_error(code, message)),
                    _ => Ok(()),
                };
            }
        }
    }
}
