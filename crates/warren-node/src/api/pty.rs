//! The terminal route: `GET /v1/sandboxes/{id}/pty` upgraded to a WebSocket.
//!
//! Binary frames carry terminal bytes both ways; the client's text frames are
//! `{"type":"resize","cols":C,"rows":R}`; the server's last text frame is
//! `{"type":"exit","exit_code":N,"signal":S}` (or `{"type":"error","error":{..}}`), then it
//! closes. The terminal is started before the upgrade, so a bad sandbox or command answers a
//! plain JSON error. Everything typed and printed is logged in the sandbox's trajectory as
//! `terminal` entries.

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use warren_runtime::StreamItem;

use super::error::{HttpError, HttpResult};
use super::extract::{QueryPairs, SandboxParam};
use crate::manager::{PtyRequest, TerminalSession, Terminals, DEFAULT_SHELL};

/// `cmd` is a program (`/bin/bash`), or a shell command line when it has spaces.
pub(crate) fn pty_request(q: &QueryPairs) -> HttpResult<PtyRequest> {
    q.only(&["cmd", "cols", "rows"], &[])?;
    let cmd = q.get("cmd").unwrap_or(DEFAULT_SHELL);
    if cmd.trim().is_empty() {
        return Err(HttpError::invalid("cmd must not be empty"));
    }
    let argv = if cmd.contains(char::is_whitespace) {
        vec!["/bin/sh".to_string(), "-c".to_string(), cmd.to_string()]
    } else {
        vec![cmd.to_string()]
    };
    let cols = q.parsed::<u16>("cols", "a number 1-65535")?.unwrap_or(80);
    let rows = q.parsed::<u16>("rows", "a number 1-65535")?.unwrap_or(24);
    Ok(PtyRequest { argv, cols, rows })
}

pub async fn pty(
    State(terminals): State<Terminals>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> HttpResult<Response> {
    let ws =
        ws.map_err(|e| HttpError::invalid(format!("this route needs a WebSocket upgrade: {e}")))?;
    let req = pty_request(&q)?;
    let session = terminals.pty(&id, req).await?;
    Ok(ws.on_upgrade(move |socket| bridge(socket, session)))
}

#[derive(Deserialize)]
struct Control {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

async fn bridge(socket: WebSocket, session: TerminalSession) {
    let TerminalSession {
        input,
        mut output,
        guard,
        log,
    } = session;
    let (mut tx, mut rx) = socket.split();
    let inbound = async {
        while let Some(Ok(msg)) = rx.next().await {
            let sent = match msg {
                Message::Binary(b) => {
                    log.input(&b);
                    input.input(b).await
                }
                Message::Text(t) => match serde_json::from_str::<Control>(t.as_str()) {
                    Ok(c) if c.kind == "resize" && c.cols > 0 && c.rows > 0 => {
                        input.resize(c.cols, c.rows).await
                    }
                    // Unknown control frames are ignored, so newer clients work with this node.
                    _ => Ok(()),
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if sent.is_err() {
                break;
            }
        }
    };
    let outbound = async {
        loop {
            let last = match output.next().await {
                Some(Ok(StreamItem::Stdout(b) | StreamItem::Stderr(b))) => {
                    log.output(&b);
                    if tx.send(Message::Binary(b)).await.is_err() {
                        return;
                    }
                    continue;
                }
                Some(Ok(StreamItem::Exit(e))) => {
                    log.exit(e.exit_code, e.signal);
                    json!({"type": "exit", "exit_code": e.exit_code, "signal": e.signal})
                }
                Some(Err(e)) => {
                    let error = crate::NodeError::runtime(guard.sandbox_id(), e).to_api();
                    json!({"type": "error", "error": error})
                }
                None => json!({"type": "exit", "exit_code": null, "signal": null}),
            };
            let _ = tx.send(Message::Text(last.to_string().into())).await;
            let _ = tx.close().await;
            return;
        }
    };
    // Whichever side ends first ends the terminal: dropping the output half cancels the
    // command inside the sandbox.
    tokio::select! {
        _ = inbound => {}
        _ = outbound => {}
    }
    drop(log);
    drop(guard);
}
