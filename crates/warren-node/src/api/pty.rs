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
    Ok(PtyRequest {
        argv,
        cols,
        rows,
        cwd: None,
        env: Default::default(),
        user: None,
    })
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

/// The longest line an attached terminal's client may send.
const MAX_PTY_LINE: usize = 4 << 20;

/// Splits a body into lines as its chunks arrive.
struct Lines {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
}

impl Lines {
    /// The next line without its newline; `Ok(None)` when the body ended (a last line without
    /// a newline counts).
    async fn next(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        loop {
            if let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.buf.len() > MAX_PTY_LINE {
                return Err(HttpError::invalid(format!(
                    "a line of an attached terminal is longer than {MAX_PTY_LINE} bytes"
                )));
            }
            match self.body.next().await {
                Some(Ok(c)) => self.buf.extend_from_slice(&c),
                Some(Err(e)) => return Err(HttpError::invalid(format!("reading the body: {e}"))),
                None if self.buf.is_empty() => return Ok(None),
                None => return Ok(Some(std::mem::take(&mut self.buf))),
            }
        }
    }
}

/// `POST /v1/sandboxes/{id}/pty/attach`: a terminal over plain HTTP. The body is a
/// `PtyAttachRequest` line, then `PtyClientLine`s (input, resize) for as long as the client
/// likes; the answer is `PtyServerLine`s (output, then exit or error), sent as they come.
/// Dropping the answer ends the terminal; the body ending does not.
pub async fn pty_attach(
    State(terminals): State<Terminals>,
    SandboxParam(id): SandboxParam,
    body: super::extract::RawBody,
) -> HttpResult<Response> {
    use axum::body::{Body, Bytes};
    use axum::response::IntoResponse;
    use base64::Engine;
    use warren_types::{PtyAttachRequest, PtyClientLine, PtyServerLine};

    let mut lines = Lines {
        body: body.into_data_stream(),
        buf: Vec::new(),
    };
    let head = lines.next().await?.ok_or_else(|| {
        HttpError::invalid("the body must start with the terminal's request as one JSON line")
    })?;
    let req: PtyAttachRequest = serde_json::from_slice(&head)
        .map_err(|e| HttpError::invalid(format!("the terminal request line is not valid: {e}")))?;
    let session = terminals
        .pty(
            &id,
            PtyRequest {
                argv: req.argv.unwrap_or_else(|| vec![DEFAULT_SHELL.to_string()]),
                cols: req.cols,
                rows: req.rows,
                cwd: req.cwd,
                env: req.env,
                user: req.user,
            },
        )
        .await?;
    let TerminalSession {
        input,
        output,
        guard,
        log,
    } = session;
    let log = std::sync::Arc::new(log);
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<warren_types::ApiError>();
    let in_log = log.clone();
    let inbound = tokio::spawn(async move {
        let b64 = base64::engine::general_purpose::STANDARD;
        loop {
            let line = match lines.next().await {
                Ok(Some(l)) if l.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(Some(l)) => l,
                Ok(None) => return,
                Err(e) => {
                    let _ = fail_tx.send(e.error);
                    return;
                }
            };
            let sent = match serde_json::from_slice::<PtyClientLine>(&line) {
                Ok(PtyClientLine::Input { data }) => match b64.decode(data.as_bytes()) {
                    Ok(d) => {
                        let d = Bytes::from(d);
                        in_log.input(&d);
                        input.input(d).await
                    }
                    Err(e) => {
                        let _ = fail_tx.send(warren_types::ApiError::invalid(format!(
                            "input is not base64: {e}"
                        )));
                        return;
                    }
                },
                Ok(PtyClientLine::Resize { cols, rows }) if cols > 0 && rows > 0 => {
                    input.resize(cols, rows).await
                }
                Ok(PtyClientLine::Resize { .. }) => {
                    let _ = fail_tx.send(warren_types::ApiError::invalid(
                        "cols and rows must be at least 1",
                    ));
                    return;
                }
                Err(e) => {
                    let _ = fail_tx.send(warren_types::ApiError::invalid(format!(
                        "a terminal line is not valid: {e}"
                    )));
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    struct Out {
        output: warren_runtime::agent::PtyOutput,
        fail: tokio::sync::oneshot::Receiver<warren_types::ApiError>,
        log: std::sync::Arc<crate::manager::TerminalLog>,
        guard: crate::manager::ActivityGuard,
        inbound: tokio::task::JoinHandle<()>,
        done: bool,
    }
    impl Drop for Out {
        fn drop(&mut self) {
            self.inbound.abort();
        }
    }
    let st = Out {
        output,
        fail: fail_rx,
        log,
        guard,
        inbound,
        done: false,
    };
    let stream = futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let line = tokio::select! {
            item = st.output.next() => match item {
                Some(Ok(StreamItem::Stdout(b) | StreamItem::Stderr(b))) => {
                    st.log.output(&b);
                    PtyServerLine::Output { data: b64.encode(&b) }
                }
                Some(Ok(StreamItem::Exit(e))) => {
                    st.log.exit(e.exit_code, e.signal);
                    st.done = true;
                    PtyServerLine::Exit { exit_code: e.exit_code, signal: e.signal }
                }
                Some(Err(e)) => {
                    st.done = true;
                    PtyServerLine::Error {
                        error: crate::NodeError::runtime(st.guard.sandbox_id(), e).to_api(),
                    }
                }
                None => {
                    st.done = true;
                    PtyServerLine::Exit { exit_code: None, signal: None }
                }
            },
            Ok(error) = &mut st.fail => {
                st.done = true;
                PtyServerLine::Error { error }
            }
        };
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), st))
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}
