//! Interactive terminals: `GET /v1/sandboxes/{id}/pty` upgraded to a WebSocket over the same
//! transport as every other call.
//!
//! Binary frames carry terminal bytes both ways. The client sends
//! `{"type":"resize","cols":C,"rows":R}` text frames; the daemon's last text frame is
//! `{"type":"exit","exit_code":N,"signal":S}` or `{"type":"error","error":{..}}`. A terminal holds its own connection, outside the pool.

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

use crate::client::{enc, seg, Client};
use crate::error::ClientError;
use crate::transport::RawStream;

type Ws = WebSocketStream<RawStream>;

/// What a terminal sends back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyEvent {
    /// Terminal output bytes.
    Output(Bytes),
    /// The command ended: its exit code, or the signal that killed it (each `None` when the
    /// daemon did not report it).
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

/// An open terminal. Use it directly, or [`PtySession::split`] it to read and write from
/// separate tasks.
pub struct PtySession {
    ws: Ws,
}

impl std::fmt::Debug for PtySession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtySession").finish_non_exhaustive()
    }
}

/// The sending half of a split terminal.
pub struct PtyWriter {
    sink: SplitSink<Ws, Message>,
}

impl std::fmt::Debug for PtyWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyWriter").finish_non_exhaustive()
    }
}

/// The receiving half of a split terminal.
pub struct PtyReader {
    stream: SplitStream<Ws>,
}

impl std::fmt::Debug for PtyReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyReader").finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct ControlFrame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    signal: Option<i32>,
    #[serde(default)]
    error: Option<warren_types::ApiError>,
}

/// The text frame that asks for a new window size.
pub fn resize_frame(cols: u16, rows: u16) -> String {
    format!(r#"{{"type":"resize","cols":{cols},"rows":{rows}}}"#)
}

/// Turns one incoming message into an event; `Ok(None)` for frames that carry nothing.
fn decode(msg: Message) -> Result<Option<Option<PtyEvent>>, ClientError> {
    match msg {
        Message::Binary(b) => Ok(Some(Some(PtyEvent::Output(b)))),
        Message::Text(t) => {
            let frame: ControlFrame = serde_json::from_str(t.as_str())
                .map_err(|e| ClientError::decode("a terminal control frame", e))?;
            match frame.kind.as_str() {
                "exit" => Ok(Some(Some(PtyEvent::Exit {
                    exit_code: frame.exit_code,
                    signal: frame.signal,
                }))),
                "error" => match frame.error {
                    Some(error) => Err(ClientError::Api { status: 0, error }),
                    None => Err(ClientError::Protocol(
                        "terminal error frame without error".into(),
                    )),
                },
                // Control frames this client does not know are skipped.
                _ => Ok(None),
            }
        }
        Message::Close(_) => Ok(Some(None)),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Ok(None),
    }
}

async fn next_from<S>(stream: &mut S) -> Result<Option<PtyEvent>, ClientError>
where
    S: futures::Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    loop {
        match stream.next().await {
            None => return Ok(None),
            Some(Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed)) => {
                return Ok(None)
            }
            Some(Err(e)) => return Err(ClientError::websocket("reading", e)),
            Some(Ok(msg)) => {
                if let Some(ev) = decode(msg)? {
                    return Ok(ev);
                }
            }
        }
    }
}

impl PtySession {
    /// Sends terminal input.
    pub async fn send(&mut self, data: impl Into<Bytes>) -> Result<(), ClientError> {
        self.ws
            .send(Message::Binary(data.into()))
            .await
            .map_err(|e| ClientError::websocket("sending input", e))
    }

    /// Tells the daemon the window size changed.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.ws
            .send(Message::text(resize_frame(cols, rows)))
            .await
            .map_err(|e| ClientError::websocket("sending a resize", e))
    }

    /// The next output chunk or the exit; `None` once the connection closed.
    pub async fn next_event(&mut self) -> Result<Option<PtyEvent>, ClientError> {
        next_from(&mut self.ws).await
    }

    /// Closes the WebSocket; the daemon ends the terminal's command.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.ws
            .close(None)
            .await
            .map_err(|e| ClientError::websocket("closing", e))
    }

    /// Splits into halves that can be used from different tasks.
    pub fn split(self) -> (PtyWriter, PtyReader) {
        let (sink, stream) = self.ws.split();
        (PtyWriter { sink }, PtyReader { stream })
    }
}

impl PtyWriter {
    /// Sends terminal input.
    pub async fn send(&mut self, data: impl Into<Bytes>) -> Result<(), ClientError> {
        self.sink
            .send(Message::Binary(data.into()))
            .await
            .map_err(|e| ClientError::websocket("sending input", e))
    }

    /// Tells the daemon the window size changed.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.sink
            .send(Message::text(resize_frame(cols, rows)))
            .await
            .map_err(|e| ClientError::websocket("sending a resize", e))
    }

    /// Sends a close frame.
    pub async fn close(&mut self) -> Result<(), ClientError> {
        self.sink
            .close()
            .await
            .map_err(|e| ClientError::websocket("closing", e))
    }
}

impl PtyReader {
    /// The next output chunk or the exit; `None` once the connection closed.
    pub async fn next_event(&mut self) -> Result<Option<PtyEvent>, ClientError> {
        next_from(&mut self.stream).await
    }
}

impl Client {
    /// Opens an interactive terminal running `cmd` in sandbox `id`, sized `cols`×`rows`.
    pub async fn pty(
        &self,
        id: &str,
        cmd: &str,
        cols: u16,
        rows: u16,
    ) -> Result<PtySession, ClientError> {
        let (stream, authority) = self.connect_raw().await?;
        let url = format!(
            "ws://{authority}/v1/sandboxes/{}/pty?cmd={}&cols={cols}&rows={rows}",
            seg(id),
            enc(cmd)
        );
        let mut request = url
            .into_client_request()
            .map_err(|e| ClientError::websocket("building the terminal request", e))?;
        if let Some(auth) = self.auth_header() {
            request
                .headers_mut()
                .insert(hyper::header::AUTHORIZATION, auth.clone());
        }
        let (ws, _response) = tokio_tungstenite::client_async(request, stream)
            .await
            .map_err(|e| match e {
                tungstenite::Error::Http(resp) => {
                    let body = resp.body().as_deref().unwrap_or_default();
                    self.with_url(
                        self.current_endpoint(),
                        ClientError::from_response(resp.status().as_u16(), body),
                    )
                }
                e => ClientError::websocket("opening the terminal", e),
            })?;
        Ok(PtySession { ws })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames() {
        assert_eq!(
            resize_frame(80, 24),
            r#"{"type":"resize","cols":80,"rows":24}"#
        );
        let ev = decode(Message::text(r#"{"type":"exit","exit_code":3}"#)).unwrap();
        assert_eq!(
            ev,
            Some(Some(PtyEvent::Exit {
                exit_code: Some(3),
                signal: None
            }))
        );
        let ev = decode(Message::text(
            r#"{"type":"exit","exit_code":null,"signal":9}"#,
        ))
        .unwrap();
        assert_eq!(
            ev,
            Some(Some(PtyEvent::Exit {
                exit_code: None,
                signal: Some(9)
            }))
        );
        assert_eq!(decode(Message::text(r#"{"type":"hello"}"#)).unwrap(), None);
        assert!(decode(Message::text("nope")).is_err());
        let err = decode(Message::text(
            r#"{"type":"error","error":{"code":"not_found","message":"x"}}"#,
        ))
        .unwrap_err();
        assert!(err.is_not_found());
    }
}
