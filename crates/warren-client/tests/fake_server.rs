//! The client against a small in-process axum server on a Unix socket in a temp dir. The
//! server fakes the daemon's answers; what is tested is the client's side of the contract:
//! URLs, JSON bodies, error mapping, NDJSON streaming, streamed uploads and downloads, the
//! terminal WebSocket, and connection reuse under many concurrent calls.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use bytes::Bytes;
use futures::StreamExt;
use warren_client::{
    ApiError, Client, ClientError, CreateSandboxRequest, ErrorBody, ErrorCode, ExecEvent,
    ExecRequest, ExecResult, FileKind, FileStat, Limits, ProcessInfo, ProcessState, PtyEvent,
    SandboxInfo, SandboxState, Substrate,
};

const BIG: u64 = 50 << 20;
const CHUNK: usize = 64 << 10;

/// Byte `i` of the test pattern.
fn pattern(i: u64) -> u8 {
    ((i * 31 + 7) % 251) as u8
}

fn pattern_chunk(start: u64, len: usize) -> Bytes {
    (0..len as u64)
        .map(|i| pattern(start + i))
        .collect::<Vec<u8>>()
        .into()
}

/// What an upload delivered: bytes received, whether they matched the pattern, the mode.
type Upload = (u64, bool, Option<u32>);

#[derive(Default)]
struct Fake {
    /// path -> what was uploaded there
    uploads: Mutex<HashMap<String, Upload>>,
    connections: AtomicUsize,
}

type St = State<Arc<Fake>>;

fn api_error(code: ErrorCode, msg: &str) -> Response {
    let status = StatusCode::from_u16(code.http_status()).unwrap();
    (
        status,
        Json(ErrorBody {
            error: ApiError::new(code, msg),
        }),
    )
        .into_response()
}

fn info(id: &str, req: &CreateSandboxRequest) -> SandboxInfo {
    SandboxInfo {
        id: id.to_string(),
        substrate: req.substrate,
        state: SandboxState::Running,
        image: req.image.refs(),
        limits: Limits::default(),
        labels: req.labels.clone(),
        env: req.env.clone(),
        workdir: req.workdir.clone(),
        user: req.user.clone(),
        network: Default::default(),
        created_at_ms: 1,
        expires_at_ms: None,
        idle_timeout_secs: None,
        last_activity_ms: 1,
        reason: None,
        idempotency_key: req.idempotency_key.clone(),
        tenant: None,
        pty: false,
    }
}

async fn health() -> Json<serde_json::Value> {
    Json(
        serde_json::json!({"status":"ok","node":"n1","version":"0.1.0","substrates":["container"]}),
    )
}

async fn create(Json(req): Json<CreateSandboxRequest>) -> Response {
    (
        StatusCode::CREATED,
        Json(info("n1-01jd0m7x4e8k0k9yq1w2e3r4t5", &req)),
    )
        .into_response()
}

async fn list(RawQuery(q): RawQuery) -> Json<serde_json::Value> {
    // The raw query comes back as a label so the test can check how it was encoded.
    let mut req = CreateSandboxRequest::default();
    req.labels.insert("query".into(), q.unwrap_or_default());
    Json(serde_json::json!({"sandboxes": [info("n1-a", &req)]}))
}

async fn get_sandbox(Path(id): Path<String>) -> Response {
    match id.as_str() {
        "n1-missing" => api_error(ErrorCode::NotFound, "no sandbox n1-missing"),
        "n1-plain" => (StatusCode::BAD_GATEWAY, "upstream fell over").into_response(),
        _ => Json(info(&id, &CreateSandboxRequest::default())).into_response(),
    }
}

async fn delete_sandbox(Path(_id): Path<String>) -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn exec(Path(_id): Path<String>, Json(req): Json<ExecRequest>) -> Json<ExecResult> {
    Json(ExecResult {
        exit_code: Some(0),
        stdout: req.command().join(" "),
        stdout_bytes: 0,
        ..Default::default()
    })
}

async fn exec_stream(Path(_id): Path<String>, Json(_req): Json<ExecRequest>) -> Response {
    let mut text = String::new();
    for ev in [
        ExecEvent::Stdout {
            data: "hello ".into(),
        },
        ExecEvent::Stderr {
            data: "oops".into(),
        },
        ExecEvent::Stdout {
            data: "world".into(),
        },
        ExecEvent::Exit {
            result: ExecResult {
                exit_code: Some(7),
                ..Default::default()
            },
        },
    ] {
        text.push_str(&serde_json::to_string(&ev).unwrap());
        text.push('\n');
    }
    // Cut the body into 5-byte chunks so lines arrive split, with small pauses.
    let chunks: Vec<Bytes> = text
        .as_bytes()
        .chunks(5)
        .map(Bytes::copy_from_slice)
        .collect();
    let stream = futures::stream::iter(chunks).then(|c| async move {
        tokio::task::yield_now().await;
        Ok::<_, std::io::Error>(c)
    });
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn spawn(Path(_id): Path<String>, Json(req): Json<ExecRequest>) -> Response {
    let p = ProcessInfo {
        pid: 42,
        argv: req.command(),
        state: ProcessState::Running,
        exit_code: None,
        signal: None,
        started_at_ms: 5,
    };
    (StatusCode::CREATED, Json(p)).into_response()
}

async fn wait(Path((_id, pid)): Path<(String, u32)>, RawQuery(q): RawQuery) -> Response {
    if q.as_deref() == Some("timeout_secs=0.5") {
        return api_error(ErrorCode::Timeout, "process still running");
    }
    Json(ExecResult {
        exit_code: Some(pid as i32),
        ..Default::default()
    })
    .into_response()
}

async fn kill(Path((_id, _pid)): Path<(String, u32)>, body: Bytes) -> Response {
    if body.as_ref() == br#"{"signal":15}"# {
        StatusCode::NO_CONTENT.into_response()
    } else {
        api_error(ErrorCode::InvalidRequest, &String::from_utf8_lossy(&body))
    }
}

async fn read_file(Query(q): Query<BTreeMap<String, String>>) -> Response {
    match q.get("path").map(String::as_str) {
        Some("/big") => {
            let chunks = (0..BIG.div_ceil(CHUNK as u64)).map(|i| {
                let start = i * CHUNK as u64;
                let len = (BIG - start).min(CHUNK as u64) as usize;
                Ok::<_, std::io::Error>(pattern_chunk(start, len))
            });
            Response::new(Body::from_stream(futures::stream::iter(chunks)))
        }
        Some("/small") => Response::new(Body::from("small file\n")),
        _ => api_error(ErrorCode::NotFound, "no such file"),
    }
}

async fn write_file(
    State(st): St,
    Query(q): Query<BTreeMap<String, String>>,
    body: Body,
) -> StatusCode {
    let mut n = 0u64;
    let mut intact = true;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        intact &= chunk
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(n + i as u64));
        n += chunk.len() as u64;
    }
    let mode = q.get("mode").map(|m| m.parse().unwrap());
    st.uploads
        .lock()
        .unwrap()
        .insert(q["path"].clone(), (n, intact, mode));
    StatusCode::NO_CONTENT
}

async fn stat(Query(q): Query<BTreeMap<String, String>>) -> Json<FileStat> {
    Json(FileStat {
        name: q["path"].clone(),
        kind: FileKind::File,
        size: 3,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime_ms: 9,
        link_target: None,
    })
}

async fn pty(ws: WebSocketUpgrade, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let greeting = format!("{} {}x{}", q["cmd"], q["cols"], q["rows"]);
    ws.on_upgrade(move |socket| pty_session(socket, greeting))
}

async fn pty_session(mut socket: WebSocket, greeting: String) {
    socket.send(Message::Binary(greeting.into())).await.unwrap();
    while let Some(Ok(msg)) = socket.recv().await {
        match msg {
            Message::Binary(b) if b.as_ref() == b"exit\r" => {
                let exit = r#"{"type":"exit","exit_code":3}"#;
                socket.send(Message::Text(exit.into())).await.unwrap();
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            Message::Binary(b) => {
                let mut echo = b"echo:".to_vec();
                echo.extend_from_slice(&b);
                socket.send(Message::Binary(echo.into())).await.unwrap();
            }
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                let reply = format!("resized {}x{}", v["cols"], v["rows"]);
                socket.send(Message::Binary(reply.into())).await.unwrap();
            }
            _ => {}
        }
    }
}

/// Starts the fake daemon; returns the client, its state and the temp dir keeping the socket.
async fn start(max_connections: usize) -> (Client, Arc<Fake>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("warren.sock");
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/sandboxes", post(create).get(list))
        .route(
            "/v1/sandboxes/{id}",
            get(get_sandbox).delete(delete_sandbox),
        )
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/exec/stream", post(exec_stream))
        .route("/v1/sandboxes/{id}/processes", post(spawn))
        .route("/v1/sandboxes/{id}/processes/{pid}/wait", post(wait))
        .route("/v1/sandboxes/{id}/processes/{pid}/kill", post(kill))
        .route("/v1/sandboxes/{id}/files", get(read_file).put(write_file))
        .route("/v1/sandboxes/{id}/files/stat", get(stat))
        .route("/v1/sandboxes/{id}/pty", get(pty))
        .with_state(fake.clone());
    let counter = fake.clone();
    let listener = tokio::net::UnixListener::bind(&sock)
        .unwrap()
        .tap_io(move |_io| {
            counter.connections.fetch_add(1, Ordering::Relaxed);
        });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder()
        .url(format!("unix://{}", sock.display()))
        .max_connections(max_connections)
        .build()
        .unwrap();
    (client, fake, dir)
}

#[tokio::test]
async fn json_round_trips() {
    let (c, _fake, _dir) = start(8).await;
    let h = c.health().await.unwrap();
    assert!(h.is_ok());
    assert_eq!(h.substrates, ["container"]);

    let mut req = CreateSandboxRequest {
        substrate: Substrate::Container,
        image: warren_client::ImageRef::Stack(vec!["default".into(), "task:1".into()]),
        ..Default::default()
    };
    req.labels.insert("job".into(), "7".into());
    let sb = c.create(&req).await.unwrap();
    assert_eq!(sb.image, ["default", "task:1"]);
    assert_eq!(sb.labels["job"], "7");

    let got = c.get("n1-01jd0m7x4e8k0k9yq1w2e3r4t5").await.unwrap();
    assert_eq!(got.id, "n1-01jd0m7x4e8k0k9yq1w2e3r4t5");

    let labels: BTreeMap<String, String> = [("job".to_string(), "a b".to_string())].into();
    let list = c.list(&labels, Some(SandboxState::Running)).await.unwrap();
    assert_eq!(list[0].labels["query"], "label=job%3Da%20b&state=running");
    c.delete("n1-x").await.unwrap();

    let r = c
        .exec("n1-x", &ExecRequest::argv(["echo", "hi"]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "echo hi");

    let p = c
        .spawn("n1-x", &ExecRequest::shell("sleep 9"))
        .await
        .unwrap();
    assert_eq!((p.pid, p.argv.len()), (42, 3));
    let r = c.wait_process("n1-x", 5, None).await.unwrap();
    assert_eq!(r.exit_code, Some(5));
    c.kill_process("n1-x", 5, Some(15)).await.unwrap();

    let st = c.stat("n1-x", "/etc/hostname").await.unwrap();
    assert_eq!(st.name, "/etc/hostname");
}

#[tokio::test]
async fn error_bodies_map_to_typed_errors() {
    let (c, _fake, _dir) = start(8).await;
    let e = c.get("n1-missing").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.status(), Some(404));

    let e = c.get("n1-plain").await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Status { status: 502, body } if body == "upstream fell over")
    );

    let e = c
        .wait_process("n1-x", 1, Some(Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Timeout));
    assert_eq!(e.status(), Some(504));

    let e = c.read_file("n1-x", "/nope").await.unwrap_err();
    assert!(e.is_not_found());

    // A route the fake serves only for POST answers a bare 405 without a JSON body.
    let e = c.list_processes("n1-x").await.unwrap_err();
    assert_eq!(e.status(), Some(405));

    // Nothing listens here: a transport error naming the endpoint.
    let dead = Client::new("unix:///nonexistent/warren.sock").unwrap();
    let e = dead.health().await.unwrap_err();
    assert!(matches!(e, ClientError::Transport { .. }));
    assert!(
        e.to_string().contains("unix:///nonexistent/warren.sock"),
        "{e}"
    );
}

#[tokio::test]
async fn ndjson_events_stream_in_order() {
    let (c, _fake, _dir) = start(8).await;
    let stream = c
        .exec_stream("n1-x", &ExecRequest::argv(["x"]))
        .await
        .unwrap();
    let mut out = String::new();
    let mut err = String::new();
    let result = stream
        .finish(|ev| match ev {
            ExecEvent::Stdout { data } => out.push_str(data),
            ExecEvent::Stderr { data } => err.push_str(data),
            _ => unreachable!(),
        })
        .await
        .unwrap();
    assert_eq!((out.as_str(), err.as_str()), ("hello world", "oops"));
    assert_eq!(result.exit_code, Some(7));

    let events: Vec<_> = c
        .exec_stream("n1-x", &ExecRequest::argv(["x"]))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(events.len(), 4);
    assert!(matches!(events[3], Ok(ExecEvent::Exit { .. })));
}

#[tokio::test]
async fn big_files_stream_both_ways() {
    let (c, fake, dir) = start(8).await;

    // Upload 50 MiB generated on the fly: never held in memory as a whole.
    let chunks = (0..BIG.div_ceil(CHUNK as u64)).map(|i| {
        let start = i * CHUNK as u64;
        let len = (BIG - start).min(CHUNK as u64) as usize;
        Ok::<_, std::io::Error>(pattern_chunk(start, len))
    });
    c.write_file(
        "n1-x",
        "/up/big",
        Some(0o600),
        futures::stream::iter(chunks),
    )
    .await
    .unwrap();
    assert_eq!(
        fake.uploads.lock().unwrap()["/up/big"],
        (BIG, true, Some(0o600))
    );

    // Download 50 MiB chunk by chunk, checking each byte.
    let mut stream = c.read_file("n1-x", "/big").await.unwrap();
    let mut n = 0u64;
    let mut largest = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert!(chunk
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(n + i as u64)));
        largest = largest.max(chunk.len());
        n += chunk.len() as u64;
    }
    assert_eq!(n, BIG);
    assert!(
        largest <= 1 << 20,
        "chunks should stay small, got {largest}"
    );

    // Local file helpers, with the mode taken from the local file.
    let local = dir.path().join("down");
    assert_eq!(c.download_to("n1-x", "/big", &local).await.unwrap(), BIG);
    std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o751)).unwrap();
    assert_eq!(
        c.upload_from("n1-x", &local, "/up/copy", None)
            .await
            .unwrap(),
        BIG
    );
    assert_eq!(
        fake.uploads.lock().unwrap()["/up/copy"],
        (BIG, true, Some(0o751))
    );

    // A failed download leaves no partial file behind.
    let missing = dir.path().join("missing");
    assert!(c.download_to("n1-x", "/nope", &missing).await.is_err());
    assert!(!missing.exists());

    assert_eq!(
        c.read_file_bytes("n1-x", "/small").await.unwrap(),
        "small file\n"
    );
    let reader = tokio::io::BufReader::new(&b"xyz"[..]);
    c.write_file_from("n1-x", "/up/r", None, reader)
        .await
        .unwrap();
    assert_eq!(fake.uploads.lock().unwrap()["/up/r"].0, 3);
}

#[tokio::test]
async fn terminal_over_websocket() {
    let (c, _fake, _dir) = start(8).await;
    let mut pty = c.pty("n1-x", "/bin/bash -l", 80, 24).await.unwrap();
    let out = |ev: Option<PtyEvent>| match ev {
        Some(PtyEvent::Output(b)) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("expected output, got {other:?}"),
    };
    assert_eq!(out(pty.next_event().await.unwrap()), "/bin/bash -l 80x24");
    pty.send(&b"ls\r"[..]).await.unwrap();
    assert_eq!(out(pty.next_event().await.unwrap()), "echo:ls\r");
    pty.resize(100, 40).await.unwrap();
    assert_eq!(out(pty.next_event().await.unwrap()), "resized 100x40");

    let (mut tx, mut rx) = pty.split();
    tx.send(&b"exit\r"[..]).await.unwrap();
    assert_eq!(
        rx.next_event().await.unwrap(),
        Some(PtyEvent::Exit {
            exit_code: Some(3),
            signal: None
        })
    );
    assert_eq!(rx.next_event().await.unwrap(), None);

    let e = c.pty("n1-x", "sh", 80, 24).await.map(|_| ());
    assert!(e.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_calls_share_few_connections() {
    let (c, fake, _dir) = start(32).await;
    let calls = (0..3000).map(|_| {
        let c = c.clone();
        tokio::spawn(async move { c.health().await })
    });
    for r in futures::future::join_all(calls).await {
        assert!(r.unwrap().unwrap().is_ok());
    }
    // At most 32 requests are in flight; a connection on its way back to the pool may be
    // replaced by a new one, so allow some slack, but nothing near one per call.
    let opened = fake.connections.load(Ordering::Relaxed);
    assert!(opened <= 64, "opened {opened} connections for 3000 calls");
}
