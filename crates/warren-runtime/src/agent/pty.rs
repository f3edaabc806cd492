//! Terminal sessions: a PTY stream split into an input half and an output half.

use bytes::Bytes;
use tokio::sync::mpsc;
use warren_proto::{Control, Frame, Kind, MAX_PAYLOAD};

use super::{exit_info, Output, Stream, StreamItem};
use crate::RuntimeError;

/// A terminal session.
pub struct PtySession {
    pub(super) s: Stream,
}

impl PtySession {
    /// Keystrokes to the terminal.
    pub async fn input(&self, data: Bytes) -> Result<(), RuntimeError> {
        for off in (0..data.len()).step_by(MAX_PAYLOAD) {
            let end = (off + MAX_PAYLOAD).min(data.len());
            self.s
                .send(Frame::new(self.s.id, Kind::Stdin, data.slice(off..end)))
                .await?;
        }
        Ok(())
    }

    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        self.s
            .send(Frame::json(
                self.s.id,
                Kind::Control,
                &Control::Resize { cols, rows },
            ))
            .await
    }

    /// Splits into an input half and an output half for use from two tasks.
    pub fn split(self) -> (PtyInput, PtyOutput) {
        let input = PtyInput {
            id: self.s.id,
            tx: self.s.conn.inner.tx.clone(),
        };
        (input, PtyOutput { s: self.s })
    }
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
        for off in (0..data.len()).step_by(MAX_PAYLOAD) {
            let end = (off + MAX_PAYLOAD).min(data.len());
            self.tx
                .send(Frame::new(self.id, Kind::Stdin, data.slice(off..end)))
                .await
                .map_err(|_| RuntimeError::AgentLost)?;
        }
        Ok(())
    }
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        self.tx
            .send(Frame::json(
                self.id,
                Kind::Control,
                &Control::Resize { cols, rows },
            ))
            .await
            .map_err(|_| RuntimeError::AgentLost)
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
                Ok(Output::Data(..)) => {}
                Ok(Output::Final(ev)) => return exit_info(&ev).map(|e| Ok(StreamItem::Exit(e))),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
