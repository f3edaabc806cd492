//! File transfer (streamed reads and writes, tar streams both ways) and the file-system
//! calls answered by one event.

use bytes::Bytes;
use warren_proto::{Call, Event, Frame, Kind};
use warren_types::FileStat;

use super::streams::{send_stdin, Output, Stream};
use super::{from_event_error, parse_event, unexpected, AgentConn, WINDOW};
use crate::RuntimeError;

impl AgentConn {
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
            Kind::Event => {
                s.done = true;
                match parse_event(&first)? {
                    Event::Error { code, message } => return Err(from_event_error(code, message)),
                    _ => None,
                }
            }
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
        let path = path.to_string();
        match self.simple(Call::Stat { path }).await? {
            Event::Stat { stat } => Ok(stat),
            other => Err(unexpected(&other)),
        }
    }

    /// One page of a directory (see [`Call::List`]); the name to continue after, if any.
    pub async fn list(
        &self,
        path: &str,
        after: Option<&str>,
        limit: Option<u32>,
    ) -> Result<(Vec<FileStat>, Option<String>), RuntimeError> {
        let call = Call::List {
            path: path.to_string(),
            after: after.map(String::from),
            limit,
        };
        match self.simple(call).await? {
            Event::Entries { entries, next } => Ok((entries, next)),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn mkdir(
        &self,
        path: &str,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<(), RuntimeError> {
        let path = path.to_string();
        let call = Call::Mkdir {
            path,
            parents,
            mode,
        };
        self.simple(call).await.map(|_| ())
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), RuntimeError> {
        let path = path.to_string();
        let call = Call::Remove { path, recursive };
        self.simple(call).await.map(|_| ())
    }

    pub async fn chmod(&self, path: &str, mode: u32) -> Result<(), RuntimeError> {
        let path = path.to_string();
        self.simple(Call::Chmod { path, mode }).await.map(|_| ())
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
                Ok(Output::Data(..) | Output::Note(_)) => {}
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
                return match parse_event(&f) {
                    Ok(Event::Error { code, message }) => Err(from_event_error(code, message)),
                    _ => Err(RuntimeError::Protocol(
                        crate::ProtocolError::WriteEndedEarly,
                    )),
                };
            }
        }
        send_stdin(self.s.tx(), self.s.id, &data).await
    }

    /// Ends the upload and waits for the agent's verdict.
    pub async fn finish(mut self) -> Result<(), RuntimeError> {
        self.s
            .send(Frame::new(self.s.id, Kind::Eof, Bytes::new()))
            .await?;
        let _verdict = self.s.next_event().await?;
        self.s.done = true;
        Ok(())
    }
}
