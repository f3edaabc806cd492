//! The `process.Process` service over Warren's attached exec.
//!
//! Every `Start` is one `POST /v1/sandboxes/{id}/exec/attach`: its request body stays open
//! as the command's stdin (fed by `SendInput`, `StreamInput`, ended by `CloseStdin`), its
//! NDJSON answer is the command's output. A `Start` without stdin (`stdin: false`, what
//! `commands.run` sends by default) is one `POST .../exec/stream` instead: same events, the
//! command's stdin is /dev/null (as envd's is), and there is no stdin to feed. A task here owns that call for the command's whole
//! life, so the command outlives the client's stream (E2B's background commands), and hands
//! each event to whoever listens: the `Start` stream and any `Connect` stream after it.
//! Commands are numbered per Envd (the pid the SDK sees), listed by `List`, ended by
//! `SendSignal` (which ends the call: Warren kills the command's tree).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use warren_types::{
    ExecEvent, ExecRequest, ExecResult, PtyAttachRequest, PtyClientLine, PtyServerLine,
};

use crate::connect::{self, CallKind, Code, Codec, ConnectError, EnvelopeReader};
use crate::pb::json::b64;
use crate::pb::process as pb;
use crate::pb::Empty;
use crate::users::Users;
use crate::v1::Sandbox;

/// The header in which the SDK asks for keepalive messages every so many seconds.
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

/// The commands started through this envd, by sandbox and pid.
#[derive(Default)]
pub struct Procs {
    by_sandbox: Mutex<HashMap<String, HashMap<u32, Arc<Proc>>>>,
    next_pid: AtomicU32,
}

type Item = Result<pb::ProcessEvent, ConnectError>;

struct Proc {
    pid: u32,
    tag: Option<String>,
    config: pb::ProcessConfig,
    /// A terminal: its body carries `PtyClientLine`s, its answer `PtyServerLine`s.
    pty: bool,
    /// The command's stdin (the attached call's body), `None` once closed or never opened.
    stdin: tokio::sync::Mutex<Option<mpsc::Sender<Bytes>>>,
    /// Who listens to the command's events.
    subs: Mutex<Vec<mpsc::Sender<Item>>>,
    kill: CancellationToken,
}

impl Procs {
    fn get(
        &self,
        sandbox: &str,
        sel: Option<&pb::ProcessSelector>,
    ) -> Result<Arc<Proc>, ConnectError> {
        let sel = sel
            .and_then(|s| s.selector.as_ref())
            .ok_or_else(|| ConnectError::invalid("the request names no process (pid or tag)"))?;
        let map = self.by_sandbox.lock().unwrap_or_else(|e| e.into_inner());
        let procs = map.get(sandbox);
        let found = match sel {
            pb::Selector::Pid(pid) => procs.and_then(|p| p.get(pid)).cloned(),
            pb::Selector::Tag(tag) => procs
                .and_then(|p| p.values().find(|p| p.tag.as_deref() == Some(tag.as_str())))
                .cloned(),
        };
        found.ok_or_else(|| {
            ConnectError::new(
                Code::NotFound,
                match sel {
                    pb::Selector::Pid(pid) => format!("process with pid {pid} not found"),
                    pb::Selector::Tag(tag) => format!("process with tag {tag:?} not found"),
                },
            )
        })
    }

    fn insert(&self, sandbox: &str, p: Arc<Proc>) {
        let mut map = self.by_sandbox.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(sandbox.to_string()).or_default().insert(p.pid, p);
    }

    fn remove(&self, sandbox: &str, pid: u32) {
        let mut map = self.by_sandbox.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(procs) = map.get_mut(sandbox) {
            procs.remove(&pid);
            if procs.is_empty() {
                map.remove(sandbox);
            }
        }
    }

    fn list(&self, sandbox: &str) -> Vec<pb::ProcessInfo> {
        let map = self.by_sandbox.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<pb::ProcessInfo> = map
            .get(sandbox)
            .map(|procs| {
                procs
                    .values()
                    .map(|p| pb::ProcessInfo {
                        config: Some(p.config.clone()),
                        pid: p.pid,
                        tag: p.tag.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by_key(|p| p.pid);
        out
    }
}

impl Proc {
    fn subscribe(&self) -> mpsc::Receiver<Item> {
        let (tx, rx) = mpsc::channel(64);
        self.subs.lock().unwrap_or_else(|e| e.into_inner()).push(tx);
        rx
    }

    /// Hands `item` to every listener (waiting for slow ones: the command's output is not
    /// dropped), forgetting those that went away.
    async fn publish(&self, item: Item) {
        let subs: Vec<_> = self.subs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut gone = false;
        for s in &subs {
            // A listener that stops reading holds the command up, but never its kill.
            tokio::select! {
                r = s.send(item.clone()) => gone |= r.is_err(),
                _ = self.kill.cancelled(), if !matches!(item, Ok(pb::ProcessEvent { event: Some(pb::Event::End(_)) })) => return,
            }
        }
        if gone {
            self.subs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|s| !s.is_closed());
        }
    }
}

/// One call of the service.
pub struct Call<'a> {
    pub procs: &'a Arc<Procs>,
    pub users: &'a Users,
    pub sandbox: Sandbox,
    pub user: Option<String>,
    pub kind: CallKind,
    pub headers: HeaderMap,
    pub body: Body,
}

impl Call<'_> {
    pub async fn serve(self, method: &str) -> Response {
        let kind = self.kind;
        let r = match method {
            "Start" => self.start().await,
            "Connect" => self.connect().await,
            "List" => self.list().await,
            "SendInput" => self.send_input().await,
            "StreamInput" => self.stream_input().await,
            "SendSignal" => self.send_signal().await,
            "CloseStdin" => self.close_stdin().await,
            "Update" => self.update().await,
            other => Err(ConnectError::new(
                Code::Unimplemented,
                format!("process.Process/{other} is not a method of this service"),
            )),
        };
        r.unwrap_or_else(|e| e.into_response(kind))
    }

    fn expect(&self, streaming: bool) -> Result<Codec, ConnectError> {
        match (self.kind, streaming) {
            (CallKind::Unary(c), false) | (CallKind::Stream(c), true) => Ok(c),
            _ => Err(ConnectError::invalid(if streaming {
                "this method streams: send application/connect+json or application/connect+proto"
            } else {
                "this method is unary: send application/json or application/proto"
            })),
        }
    }

    /// The request of a unary call.
    async fn unary<M>(&mut self) -> Result<(Codec, M), ConnectError>
    where
        M: prost::Message + Default + serde::de::DeserializeOwned,
    {
        let codec = self.expect(false)?;
        connect::check_identity(&self.headers, self.kind)?;
        let body = std::mem::take(&mut self.body);
        let bytes = crate::v1::read_limited(body, connect::MAX_MESSAGE).await?;
        Ok((codec, connect::decode(codec, &bytes)?))
    }

    /// The one request message of a server-streaming call.
    async fn single<M>(&mut self) -> Result<(Codec, M), ConnectError>
    where
        M: prost::Message + Default + serde::de::DeserializeOwned,
    {
        let codec = self.expect(true)?;
        connect::check_identity(&self.headers, self.kind)?;
        let body = std::mem::take(&mut self.body);
        let bytes = crate::v1::read_limited(body, connect::MAX_MESSAGE + 5).await?;
        let mut r = EnvelopeReader::default();
        r.push(&bytes);
        let frame = r
            .next_frame()?
            .ok_or_else(|| ConnectError::invalid("the request stream holds no message"))?;
        if r.next_frame()?.is_some() {
            return Err(ConnectError::invalid(
                "a server-streaming call takes one request message",
            ));
        }
        r.finish()?;
        Ok((codec, connect::decode(codec, &frame.payload)?))
    }

    async fn start(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::StartRequest) = self.single().await?;

        let config = req
            .process
            .ok_or_else(|| ConnectError::invalid("StartRequest.process is missing"))?;
        if config.cmd.is_empty() {
            return Err(ConnectError::invalid("StartRequest.process.cmd is empty"));
        }
        let timeout = connect::timeout(&self.headers)?;
        let keepalive = keepalive(&self.headers);
        let user = self
            .users
            .resolve(&self.sandbox, self.user.as_deref())
            .await?;
        let mut argv = Vec::with_capacity(1 + config.args.len());
        argv.push(config.cmd.clone());
        argv.extend(config.args.iter().cloned());
        let cwd = config.cwd.clone().filter(|c| !c.is_empty());
        let env = config
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let pty = req.pty.map(|p| p.size.unwrap_or_default());
        // A terminal always takes input; a command when asked (envd's default is yes).
        let wants_stdin = pty.is_some() || req.stdin.unwrap_or(true);
        let (route, mut head, deadline) = match pty {
            None => {
                let exec = ExecRequest {
                    argv: Some(argv),
                    cwd,
                    env,
                    timeout_secs: timeout.map(|t| t.as_secs_f64().clamp(0.001, 604_800.0)),
                    // envd streams everything; Warren's streams stop at their cap, so the
                    // largest one (the default is 1 MiB).
                    max_output_bytes: Some(warren_types::exec::MAX_OUTPUT_CAP),
                    user,
                    encoding: warren_types::exec::OutputEncoding::Base64,
                    ..Default::default()
                };
                (
                    // Without stdin (what `commands.run` asks for unless told otherwise) the
                    // command's stdin is /dev/null, as envd's own is, and the call is a plain
                    // streamed exec: no stdin pipe, no task feeding it, no message closing it.
                    if wants_stdin {
                        "/exec/attach"
                    } else {
                        "/exec/stream"
                    },
                    serde_json::to_vec(&exec).map_err(|e| ConnectError::internal(e.to_string()))?,
                    None,
                )
            }
            Some(size) => {
                let term = PtyAttachRequest {
                    argv: Some(argv),
                    cwd,
                    env,
                    user,
                    cols: size.cols.clamp(1, 65_535) as u16,
                    rows: size.rows.clamp(1, 65_535) as u16,
                };
                (
                    "/pty/attach",
                    serde_json::to_vec(&term).map_err(|e| ConnectError::internal(e.to_string()))?,
                    timeout.map(|t| tokio::time::Instant::now() + t),
                )
            }
        };
        let (stdin_tx, resp) = if wants_stdin {
            // The body: the request line, then stdin as it is sent.
            head.push(b'\n');
            let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
            let body_stream = futures::stream::once(async move {
                Ok::<_, std::convert::Infallible>(Bytes::from(head))
            })
            .chain(tokio_stream(stdin_rx).map(Ok));
            let resp = self
                .sandbox
                .call(
                    Method::POST,
                    route,
                    Some("application/octet-stream"),
                    Body::from_stream(body_stream),
                )
                .await?;
            (Some(stdin_tx), resp)
        } else {
            let resp = self
                .sandbox
                .call(
                    Method::POST,
                    route,
                    Some("application/json"),
                    Body::from(head),
                )
                .await?;
            (None, resp)
        };
        let pid = self.procs.next_pid.fetch_add(1, Ordering::Relaxed) % 4_000_000 + 1000;
        let proc = Arc::new(Proc {
            pid,
            tag: req.tag,
            config,
            pty: pty.is_some(),
            stdin: tokio::sync::Mutex::new(stdin_tx),
            subs: Mutex::new(Vec::new()),
            kill: CancellationToken::new(),
        });
        let rx = proc.subscribe();
        self.procs.insert(&self.sandbox.id, proc.clone());
        tokio::spawn(drive(
            self.procs.clone(),
            self.sandbox.id.clone(),
            proc,
            resp.into_body(),
            deadline,
        ));
        Ok(event_stream(codec, pid, rx, keepalive))
    }

    async fn connect(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::SelectorOnly) = self.single().await?;
        let keepalive = keepalive(&self.headers);
        let proc = self.procs.get(&self.sandbox.id, req.process.as_ref())?;
        let rx = proc.subscribe();
        Ok(event_stream(codec, proc.pid, rx, keepalive))
    }

    async fn list(mut self) -> Result<Response, ConnectError> {
        let (codec, _): (_, Empty) = self.unary().await?;
        let processes = self.procs.list(&self.sandbox.id);
        Ok(connect::unary_ok(codec, &pb::ListResponse { processes }))
    }

    async fn send_input(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::SendInputRequest) = self.unary().await?;
        let proc = self.procs.get(&self.sandbox.id, req.process.as_ref())?;
        write_input(&proc, req.input).await?;
        Ok(connect::unary_ok(codec, &Empty {}))
    }

    /// Client streaming: the first message names the process, the others carry input, in
    /// order; the answer comes when the client's stream ends.
    async fn stream_input(mut self) -> Result<Response, ConnectError> {
        let codec = self.expect(true)?;
        connect::check_identity(&self.headers, self.kind)?;
        let mut body = std::mem::take(&mut self.body).into_data_stream();
        let mut reader = EnvelopeReader::default();
        let mut proc: Option<Arc<Proc>> = None;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                ConnectError::new(Code::Canceled, format!("reading the stream: {e}"))
            })?;
            reader.push(&chunk);
            while let Some(frame) = reader.next_frame()? {
                let msg: pb::StreamInputRequest = connect::decode(codec, &frame.payload)?;
                match (msg.event, &proc) {
                    (Some(pb::StreamInputEvent::Start(s)), None) => {
                        proc = Some(self.procs.get(&self.sandbox.id, s.process.as_ref())?);
                    }
                    (Some(pb::StreamInputEvent::Start(_)), Some(_)) => {
                        return Err(ConnectError::invalid("the input stream started twice"));
                    }
                    (Some(pb::StreamInputEvent::Data(d)), Some(p)) => {
                        write_input(p, d.input).await?
                    }
                    (Some(pb::StreamInputEvent::Data(_)), None) => {
                        return Err(ConnectError::invalid(
                            "input before the stream's start message",
                        ));
                    }
                    (Some(pb::StreamInputEvent::Keepalive(_)) | None, _) => {}
                }
            }
        }
        reader.finish()?;
        let mut out = connect::stream_message(codec, &Empty {}).to_vec();
        out.extend_from_slice(&connect::end_stream(None));
        Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, codec.stream_content_type())],
            out,
        )
            .into_response())
    }

    async fn send_signal(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::SendSignalRequest) = self.unary().await?;
        if req.signal != pb::Signal::Sigkill as i32 && req.signal != pb::Signal::Sigterm as i32 {
            return Err(ConnectError::invalid(format!(
                "unknown signal {}",
                req.signal
            )));
        }
        let proc = self.procs.get(&self.sandbox.id, req.process.as_ref())?;
        proc.kill.cancel();
        Ok(connect::unary_ok(codec, &Empty {}))
    }

    async fn update(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::UpdateRequest) = self.unary().await?;
        let proc = self.procs.get(&self.sandbox.id, req.process.as_ref())?;
        if let Some(size) = req.pty.and_then(|p| p.size) {
            if !proc.pty {
                return Err(ConnectError::new(
                    Code::FailedPrecondition,
                    format!("process {} has no terminal to resize", proc.pid),
                ));
            }
            if size.cols == 0 || size.rows == 0 {
                return Err(ConnectError::invalid("cols and rows must be at least 1"));
            }
            let line = PtyClientLine::Resize {
                cols: size.cols.min(65_535) as u16,
                rows: size.rows.min(65_535) as u16,
            };
            send_line(&proc, &line).await?;
        }
        Ok(connect::unary_ok(codec, &Empty {}))
    }

    async fn close_stdin(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::SelectorOnly) = self.unary().await?;
        let proc = self.procs.get(&self.sandbox.id, req.process.as_ref())?;
        if proc.pty {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "a terminal's input is not closed; send Ctrl-D (0x04) instead",
            ));
        }
        proc.stdin.lock().await.take();
        Ok(connect::unary_ok(codec, &Empty {}))
    }
}

fn keepalive(h: &HeaderMap) -> Option<Duration> {
    let secs: u64 = h
        .get(KEEPALIVE_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (secs > 0).then(|| Duration::from_secs(secs.min(3600)))
}

async fn write_input(proc: &Proc, input: Option<pb::ProcessInput>) -> Result<(), ConnectError> {
    let data = match (input.and_then(|i| i.input), proc.pty) {
        (Some(pb::Input::Stdin(d)), false) => d,
        (Some(pb::Input::Pty(d) | pb::Input::Stdin(d)), true) => {
            if d.is_empty() {
                return Ok(());
            }
            let data = base64::engine::general_purpose::STANDARD.encode(&d);
            return send_line(proc, &PtyClientLine::Input { data }).await;
        }
        (Some(pb::Input::Pty(_)), false) => {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                format!("process {} has no terminal", proc.pid),
            ))
        }
        (None, _) => return Err(ConnectError::invalid("the request carries no input")),
    };
    let guard = proc.stdin.lock().await;
    let tx = guard.as_ref().ok_or_else(|| {
        ConnectError::new(
            Code::FailedPrecondition,
            format!(
                "the stdin of process {} is closed (or it was started without stdin)",
                proc.pid
            ),
        )
    })?;
    if data.is_empty() {
        return Ok(());
    }
    tx.send(Bytes::from(data))
        .await
        .map_err(|_| ConnectError::new(Code::NotFound, format!("process {} has ended", proc.pid)))
}

/// Sends a terminal its control line.
async fn send_line(proc: &Proc, line: &PtyClientLine) -> Result<(), ConnectError> {
    let mut b = serde_json::to_vec(line).map_err(|e| ConnectError::internal(e.to_string()))?;
    b.push(b'\n');
    let guard = proc.stdin.lock().await;
    let tx = guard.as_ref().ok_or_else(|| {
        ConnectError::new(Code::NotFound, format!("process {} has ended", proc.pid))
    })?;
    tx.send(Bytes::from(b))
        .await
        .map_err(|_| ConnectError::new(Code::NotFound, format!("process {} has ended", proc.pid)))
}

fn tokio_stream(mut rx: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Owns a command's attached call: turns its NDJSON events into process events for the
/// listeners until it ends or is killed (dropping the call kills the command's tree).
async fn drive(
    procs: Arc<Procs>,
    sandbox: String,
    proc: Arc<Proc>,
    body: Body,
    deadline: Option<tokio::time::Instant>,
) {
    let mut data = body.into_data_stream();
    let mut buf = BytesMut::new();
    let last: Item = 'outer: loop {
        let chunk = tokio::select! {
            biased;
                        _ = proc.kill.cancelled() => break Ok(killed(9)),
            _ = sleep_until(deadline) => break Err(ConnectError::new(
                Code::DeadlineExceeded,
                "the terminal's timeout passed; it was ended",
            )),
            c = data.next() => c,
        };
        let chunk = match chunk {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                break Err(ConnectError::new(
                    Code::Unavailable,
                    format!("the command's stream broke: {e}"),
                ))
            }
            None => {
                break Err(ConnectError::new(
                    Code::Unavailable,
                    "the command's stream ended without its exit",
                ))
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(nl + 1);
            let output = if proc.pty {
                match serde_json::from_slice::<PtyServerLine>(&line[..nl]) {
                    Ok(PtyServerLine::Output { data }) => {
                        pb::Output::Pty(b64::decode(&data).unwrap_or_default())
                    }
                    Ok(PtyServerLine::Exit { exit_code, signal }) => {
                        break 'outer end_of(&ExecResult {
                            exit_code,
                            signal,
                            ..Default::default()
                        })
                    }
                    Ok(PtyServerLine::Error { error }) => {
                        break 'outer Err(crate::v1::from_api(&error))
                    }
                    Err(e) => {
                        break 'outer Err(ConnectError::internal(format!(
                            "the node's line did not parse: {e}"
                        )))
                    }
                }
            } else {
                match serde_json::from_slice::<ExecEvent>(&line[..nl]) {
                    Ok(ExecEvent::Stdout { data }) => {
                        pb::Output::Stdout(b64::decode(&data).unwrap_or_default())
                    }
                    Ok(ExecEvent::Stderr { data }) => {
                        pb::Output::Stderr(b64::decode(&data).unwrap_or_default())
                    }
                    Ok(ExecEvent::Exit { result }) => break 'outer end_of(&result),
                    Ok(ExecEvent::Error { error }) => {
                        break 'outer Err(crate::v1::from_api(&error))
                    }
                    Err(e) => {
                        break 'outer Err(ConnectError::internal(format!(
                            "the node's event did not parse: {e}"
                        )))
                    }
                }
            };
            let ev = pb::ProcessEvent {
                event: Some(pb::Event::Data(pb::DataEvent {
                    output: Some(output),
                })),
            };
            proc.publish(Ok(ev)).await;
        }
    };
    // Ends the call (killing the command if it still runs) and closes stdin.
    drop(data);
    proc.stdin.lock().await.take();
    procs.remove(&sandbox, proc.pid);
    // A listener that stopped reading does not keep this task: the end waits a while only.
    let _ = tokio::time::timeout(Duration::from_secs(30), proc.publish(last)).await;
    proc.subs.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn killed(signal: i32) -> pb::ProcessEvent {
    let status = match signal {
        9 => "signal: killed".to_string(),
        15 => "signal: terminated".to_string(),
        n => format!("signal: {n}"),
    };
    pb::ProcessEvent {
        event: Some(pb::Event::End(pb::EndEvent {
            exit_code: -1,
            exited: false,
            status,
            error: None,
        })),
    }
}

/// The end event of a result; a timeout is the call's deadline passing.
fn end_of(r: &ExecResult) -> Item {
    if r.timed_out {
        return Err(ConnectError::new(
            Code::DeadlineExceeded,
            "the command's timeout passed; it was killed",
        ));
    }
    match (r.exit_code, r.signal) {
        (Some(code), _) => Ok(pb::ProcessEvent {
            event: Some(pb::Event::End(pb::EndEvent {
                exit_code: code,
                exited: true,
                status: format!("exit status {code}"),
                error: None,
            })),
        }),
        (None, Some(sig)) => Ok(killed(sig)),
        (None, None) => Ok(killed(9)),
    }
}

/// A `Start`/`Connect` answer: the start event, the command's events as they come (and a
/// keepalive message when asked for), the end of the stream.
fn event_stream(
    codec: Codec,
    pid: u32,
    rx: mpsc::Receiver<Item>,
    keepalive: Option<Duration>,
) -> Response {
    let start = pb::EventResponse {
        event: Some(pb::ProcessEvent {
            event: Some(pb::Event::Start(pb::StartEvent { pid })),
        }),
    };
    let first = connect::stream_message(codec, &start);
    let period = keepalive.unwrap_or(Duration::from_secs(3600 * 24));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    struct St {
        rx: mpsc::Receiver<Item>,
        tick: tokio::time::Interval,
        done: bool,
    }
    let rest = futures::stream::unfold(
        St {
            rx,
            tick,
            done: false,
        },
        move |mut st| async move {
            if st.done {
                return None;
            }
            let out = tokio::select! {
                item = st.rx.recv() => match item {
                    Some(Ok(ev)) => {
                        let end = matches!(ev.event, Some(pb::Event::End(_)));
                        let msg = connect::stream_message(codec, &pb::EventResponse { event: Some(ev) });
                        if end {
                            st.done = true;
                            let mut b = msg.to_vec();
                            b.extend_from_slice(&connect::end_stream(None));
                            Bytes::from(b)
                        } else {
                            msg
                        }
                    }
                    Some(Err(e)) => {
                        st.done = true;
                        connect::end_stream(Some(&e))
                    }
                    None => {
                        st.done = true;
                        connect::end_stream(None)
                    }
                },
                _ = st.tick.tick() => connect::stream_message(codec, &pb::EventResponse {
                    event: Some(pb::ProcessEvent { event: Some(pb::Event::Keepalive(Empty {})) }),
                }),
            };
            Some((Ok::<_, std::convert::Infallible>(out), st))
        },
    );
    let body = futures::stream::once(async move { Ok(first) }).chain(rest);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, codec.stream_content_type())],
        Body::from_stream(body),
    )
        .into_response()
}
