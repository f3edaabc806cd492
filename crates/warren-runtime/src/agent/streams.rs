//! One call's stream: its frames, the credit window, stdin, and the one collector of a
//! call's output (commands, function calls, waits and held steps all end through it).

use bytes::Bytes;
use tokio::sync::mpsc;
use warren_proto::{Event, Frame, Kind, MAX_PAYLOAD};

use super::StreamItem;
use super::{exit_info, from_event_error, parse_event, unexpected, AgentConn, ExecOutput};
use crate::RuntimeError;

/// Sends `data` as stdin frames of stream `id` (any size: split into frames).
pub(super) async fn send_stdin(
    tx: &mpsc::Sender<Frame>,
    id: u32,
    data: &Bytes,
) -> Result<(), RuntimeError> {
    for off in (0..data.len()).step_by(MAX_PAYLOAD) {
        let end = (off + MAX_PAYLOAD).min(data.len());
        tx.send(Frame::new(id, Kind::Stdin, data.slice(off..end)))
            .await
            .map_err(|_| RuntimeError::AgentLost)?;
    }
    Ok(())
}

/// One open stream. Dropping it before the agent finished cancels the work.
pub(super) struct Stream {
    pub(super) id: u32,
    pub(super) rx: mpsc::UnboundedReceiver<Frame>,
    conn: AgentConn,
    /// The agent has ended the call (final event or error): no cancel on drop.
    pub(super) done: bool,
}

/// What an output stream yields next.
pub(super) enum Output {
    Data(Kind, Bytes),
    /// An event before the end (`Started` is skipped; a function call's files and wait).
    Note(Event),
    /// The stream's last event (not `Error`, which is returned as `Err`).
    Final(Event),
}

/// A call's output up to its last event.
pub(super) struct Collected {
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) last: Event,
}

impl Collected {
    /// The output of a call that ends with its command's exit.
    pub(super) fn exited(self) -> Result<ExecOutput, RuntimeError> {
        let exit = exit_info(&self.last).ok_or_else(|| unexpected(&self.last))?;
        Ok(ExecOutput {
            stdout: self.stdout,
            stderr: self.stderr,
            exit,
        })
    }
}

impl Stream {
    pub(super) fn new(id: u32, rx: mpsc::UnboundedReceiver<Frame>, conn: AgentConn) -> Self {
        Stream {
            id,
            rx,
            conn,
            done: false,
        }
    }

    /// The connection's writer queue.
    pub(super) fn tx(&self) -> &mpsc::Sender<Frame> {
        &self.conn.inner.tx
    }

    /// A sink for this stream's stdin.
    pub(super) fn stdin_sink(&self) -> StdinSink {
        StdinSink {
            id: self.id,
            tx: self.tx().clone(),
            closed: false,
        }
    }

    pub(super) async fn send(&self, f: Frame) -> Result<(), RuntimeError> {
        self.tx().send(f).await.map_err(|_| RuntimeError::AgentLost)
    }

    pub(super) async fn next_frame(&mut self) -> Result<Frame, RuntimeError> {
        self.rx.recv().await.ok_or(RuntimeError::AgentLost)
    }

    /// Sends the whole stdin of a call and ends it; nothing when there is none.
    pub(super) async fn feed(&self, data: Option<Bytes>) -> Result<(), RuntimeError> {
        if let Some(data) = data {
            send_stdin(self.tx(), self.id, &data).await?;
            self.send(Frame::new(self.id, Kind::Eof, Bytes::new()))
                .await?;
        }
        Ok(())
    }

    /// The next event, passing over output. An `Error` event is returned as `Err`; the
    /// stream is done after it and after a final event.
    pub(super) async fn next_event(&mut self) -> Result<Event, RuntimeError> {
        loop {
            let f = self.next_frame().await?;
            if f.kind != Kind::Event {
                continue;
            }
            let ev = parse_event(&f);
            match ev {
                Ok(Event::Error { code, message }) => {
                    self.done = true;
                    return Err(from_event_error(code, message));
                }
                Ok(ev) => {
                    self.done |= ev.is_final();
                    return Ok(ev);
                }
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
        }
    }

    /// The next STDOUT/STDERR chunk or event, skipping `Started`. Marks the stream done when
    /// it ends, by final event or error; `None` once done.
    pub(super) async fn next_output(&mut self) -> Option<Result<Output, RuntimeError>> {
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
                Kind::Event => match parse_event(&f) {
                    Ok(Event::Started { .. }) => {}
                    Ok(Event::Error { code, message }) => {
                        self.done = true;
                        return Some(Err(from_event_error(code, message)));
                    }
                    Ok(ev) if ev.is_final() => {
                        self.done = true;
                        return Some(Ok(Output::Final(ev)));
                    }
                    Ok(ev) => return Some(Ok(Output::Note(ev))),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                },
                _ => {}
            }
        }
    }

    /// Collects the call's output up to its last event. `on_note` is the hook for the events
    /// before the end (a function call's collected files and wait); plain commands pass one
    /// that refuses them.
    pub(super) async fn collect(
        &mut self,
        mut on_note: impl FnMut(Event) -> Result<(), RuntimeError>,
    ) -> Result<Collected, RuntimeError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            match self.next_output().await {
                Some(Ok(Output::Data(Kind::Stderr, data))) => stderr.extend_from_slice(&data),
                Some(Ok(Output::Data(_, data))) => stdout.extend_from_slice(&data),
                Some(Ok(Output::Note(ev))) => on_note(ev)?,
                Some(Ok(Output::Final(last))) => {
                    return Ok(Collected {
                        stdout,
                        stderr,
                        last,
                    })
                }
                Some(Err(e)) => return Err(e),
                None => return Err(RuntimeError::AgentLost),
            }
        }
    }

    /// Lets the agent send `n` more bytes on this stream.
    pub(super) async fn credit(&self, n: usize) {
        let _ = self.send(Frame::credit(self.id, n as u32)).await;
    }
}

/// The hook of calls that expect no event before their end.
pub(super) fn no_notes(ev: Event) -> Result<(), RuntimeError> {
    Err(unexpected(&ev))
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
                .tx()
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
    pub(super) fn new(s: Stream) -> Self {
        ExecStream { s, owed: 0 }
    }

    /// The next chunk or the exit; `None` after the exit.
    pub async fn next(&mut self) -> Option<Result<StreamItem, RuntimeError>> {
        // Credit for the previous chunk is granted only now that the consumer asks for more.
        if self.owed > 0 && !self.s.done {
            self.s.credit(self.owed as usize).await;
            self.owed = 0;
        }
        loop {
            return match self.s.next_output().await? {
                Ok(Output::Data(kind, data)) => {
                    self.owed = data.len() as u32;
                    Some(Ok(if kind == Kind::Stderr {
                        StreamItem::Stderr(data)
                    } else {
                        StreamItem::Stdout(data)
                    }))
                }
                Ok(Output::Note(_)) => continue,
                Ok(Output::Final(ev)) => exit_info(&ev).map(|e| Ok(StreamItem::Exit(e))),
                Err(e) => Some(Err(e)),
            };
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
    tx: mpsc::Sender<Frame>,
    closed: bool,
}

impl StdinSink {
    /// Sends a chunk (any size; split into frames).
    pub async fn write(&mut self, data: Bytes) -> Result<(), RuntimeError> {
        send_stdin(&self.tx, self.id, &data).await
    }

    /// Ends the command's stdin.
    pub async fn close(mut self) -> Result<(), RuntimeError> {
        self.closed = true;
        self.tx
            .send(Frame::new(self.id, Kind::Eof, Bytes::new()))
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
        if let Err(mpsc::error::TrySendError::Full(eof)) = self.tx.try_send(eof) {
            // The command must see its end of input even when the writer is backed up.
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(eof).await;
            });
        }
    }
}
