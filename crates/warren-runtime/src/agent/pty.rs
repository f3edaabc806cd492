//! Terminal sessions: a PTY stream split into an input half and an output half.

use bytes::Bytes;
use tokio::sync::mpsc;
use warren_proto::{Call, Control, Event, ExecSpec, Frame, Kind};

use super::streams::{send_stdin, Output, Stream};
use super::{exit_info, unexpected, AgentConn, StreamItem, WINDOW};
use crate::RuntimeError;

impl AgentConn {
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
        match s.next_event().await? {
            Event::Started { .. } => Ok(PtySession { s }),
            other => Err(unexpected(&other)),
        }
    }
}

/// A terminal session.
pub struct PtySession {
    s: Stream,
}

impl PtySession {
    /// Keystrokes to the terminal.
    pub async fn input(&self, data: Bytes) -> Result<(), RuntimeError> {
        send_stdin(self.s.tx(), self.s.id, &data).await
    }

    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        resize(self.s.tx(), self.s.id, cols, rows).await
    }

    /// Splits into an input half and an output half for use from two tasks.
    pub fn split(self) -> (PtyInput, PtyOutput) {
        let input = PtyInput {
            id: self.s.id,
            tx: self.s.tx().clone(),
        };
        (input, PtyOutput { s: self.s })
    }
}

async fn resize(
    tx: &mpsc::Sender<Frame>,
    id: u32,
    cols: u16,
    rows: u16,
) -> Result<(), RuntimeError> {
    tx.send(Frame::json(
        id,
        Kind::Control,
        &Control::Resize { cols, rows },
    ))
    .await
    .map_err(|_| RuntimeError::AgentLost)
}

/// The input half of a terminal.
#[derive(Clone)]
pub struct PtyInput {
    id: u32,
    tx: mpsc::Sender<Frame>,
}

impl PtyInput {
    pub async fn input(&self, data: Bytes) -> Result<(), RuntimeError> {
        // Keystrokes go in input-sized frames: a huge paste stays a stream of ordinary input.
        send_stdin(&self.tx, self.id, &data).await
    }

    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        resize(&self.tx, self.id, cols, rows).await
    }
}

/// The output half of a terminal.
pub struct PtyOutput {
    s: Stream,
}

impl PtyOutput {
    /// Screen bytes, then the exit; `None` after the exit.
    pub async fn next(&mut self) -> Option<Result<StreamItem, RuntimeError>> {
        loop {
            match self.s.next_output().await? {
                Ok(Output::Data(Kind::Stdout, data)) => {
                    self.s.credit(data.len()).await;
                    return Some(Ok(StreamItem::Stdout(data)));
                }
                Ok(Output::Data(..) | Output::Note(_)) => {}
                Ok(Output::Final(ev)) => return exit_info(&ev).map(|e| Ok(StreamItem::Exit(e))),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
