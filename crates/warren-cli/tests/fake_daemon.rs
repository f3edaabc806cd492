//! The `warren` binary against a small in-process axum server that fakes the daemon on a Unix
//! socket: argument handling, output and exit codes of create, exec, cp, ls, rm and ps.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use futures::StreamExt;
use serde_json::{json, Value};

const ID: &str = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5";

#[derive(Default)]
struct Fake {
    files: Mutex<HashMap<String, Vec<u8>>>,
    deleted: Mutex<Vec<String>>,
    created: Mutex<Vec<Value>>,
}

type St = State<Arc<Fake>>;

fn sandbox(id: &str, labels: Value) -> Value {
    json!({
        "id": id, "substrate": "container", "state": "running", "image": ["default"],
        "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 1024, "pids": 512},
        "labels": labels, "env": {}, "workdir": null, "user": null, "network": "none",
        "created_at_ms": 0, "expires_at_ms": null, "idle_timeout_secs": null,
        "last_activity_ms": 0, "reason": null, "idempotency_key": null
    })
}

fn not_found(msg: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": {"code": "not_found", "message": msg}})),
    )
        .into_response()
}

async fn create(State(st): St, Json(req): Json<Value>) -> Response {
    st.created.lock().unwrap().push(req.clone());
    let labels = req.get("labels").cloned().unwrap_or(json!({}));
    (StatusCode::CREATED, Json(sandbox(ID, labels))).into_response()
}

async fn list() -> Json<Value> {
    Json(json!({"sandboxes": [sandbox(ID, json!({"run": "42"})), sandbox("n1-gone", json!({}))]}))
}

async fn delete(State(st): St, Path(id): Path<String>) -> Response {
    st.deleted.lock().unwrap().push(id.clone());
    if id == "n1-gone" {
        return not_found("gone already");
    }
    if id == "n1-broken" {
        let body = json!({"error": {"code": "internal", "message": "disk on fire"}});
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response();
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `/exec/attach`: the first line of the body is the request, the rest its stdin; answers as
/// `/exec/stream` with that stdin.
async fn exec_attach(body: Body) -> Response {
    let mut data = Vec::new();
    let mut s = body.into_data_stream();
    while let Some(c) = s.next().await {
        data.extend_from_slice(&c.unwrap());
    }
    let nl = data.iter().position(|b| *b == b'\n').expect("request line");
    let mut req: Value = serde_json::from_slice(&data[..nl]).unwrap();
    assert!(req["stdin"].is_null(), "attach carries stdin in the body");
    req["stdin"] = json!(String::from_utf8_lossy(&data[nl + 1..]));
    exec_stream(Json(req)).await
}

/// Echoes argv: stdout gets the words, stderr gets "err", then exits with the code named by
/// the last word (`exit:N`, `signal:N` or `timeout`).
async fn exec_stream(Json(req): Json<Value>) -> Response {
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    assert_eq!(req["encoding"], "base64");
    let argv: Vec<String> = serde_json::from_value(req["argv"].clone()).unwrap_or_else(|_| {
        vec![
            "sh".into(),
            "-c".into(),
            req["shell"].as_str().unwrap().to_string(),
        ]
    });
    let last = argv.last().cloned().unwrap_or_default();
    let stdin = req["stdin"].as_str().unwrap_or("").to_string();
    let mut result = json!({
        "exit_code": 0, "signal": null, "timed_out": false, "stdout": "", "stderr": "",
        "stdout_truncated": false, "stderr_truncated": false, "stdout_bytes": 0,
        "stderr_bytes": 0, "encoding": "base64", "duration_ms": 1.0
    });
    if let Some(n) = last.strip_prefix("exit:") {
        result["exit_code"] = json!(n.parse::<i32>().unwrap());
    } else if let Some(n) = last.strip_prefix("signal:") {
        result["exit_code"] = Value::Null;
        result["signal"] = json!(n.parse::<i32>().unwrap());
    } else if last == "timeout" {
        result["exit_code"] = Value::Null;
        result["signal"] = json!(9);
        result["timed_out"] = json!(true);
    }
    let events = [
        json!({"type": "stdout", "data": b64(argv.join(" ").as_bytes())}),
        json!({"type": "stdout", "data": b64(format!("|{stdin}|\n").as_bytes())}),
        json!({"type": "stderr", "data": b64(b"err\xff")}),
        json!({"type": "exit", "result": result}),
    ];
    let body: String = events.iter().map(|e| format!("{e}\n")).collect();
    Response::new(Body::from(body))
}

async fn read_file(State(st): St, Query(q): Query<BTreeMap<String, String>>) -> Response {
    match st.files.lock().unwrap().get(&q["path"]) {
        Some(data) => Response::new(Body::from(data.clone())),
        None => not_found("no such file"),
    }
}

async fn write_file(
    State(st): St,
    Query(q): Query<BTreeMap<String, String>>,
    body: Body,
) -> StatusCode {
    let mut data = Vec::new();
    let mut s = body.into_data_stream();
    while let Some(c) = s.next().await {
        data.extend_from_slice(&c.unwrap());
    }
    let key = format!(
        "{}|mode={}",
        q["path"],
        q.get("mode").map(String::as_str).unwrap_or("-")
    );
    let mut files = st.files.lock().unwrap();
    files.insert(key, data.clone());
    files.insert(q["path"].clone(), data);
    StatusCode::NO_CONTENT
}

async fn stat(Query(q): Query<BTreeMap<String, String>>) -> Response {
    let kind = if q["path"].ends_with("dir") {
        "dir"
    } else {
        "file"
    };
    if q["path"].contains("missing") {
        return not_found("no such file");
    }
    Json(json!({"name": q["path"], "kind": kind, "size": 0, "mode": 0o640, "uid": 0, "gid": 0, "mtime_ms": 0}))
        .into_response()
}

async fn processes() -> Json<Value> {
    Json(json!({"processes": [
        {"pid": 9, "argv": ["sleep", "60"], "state": "running", "exit_code": null, "signal": null, "started_at_ms": 0}
    ]}))
}

struct Daemon {
    fake: Arc<Fake>,
    url: String,
    dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

fn start() -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("w.sock");
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", axum::routing::delete(delete))
        .route("/v1/sandboxes/{id}/exec/stream", post(exec_stream))
        .route("/v1/sandboxes/{id}/exec/attach", post(exec_attach))
        .route("/v1/sandboxes/{id}/processes", get(processes))
        .route("/v1/sandboxes/{id}/files", get(read_file).put(write_file))
        .route("/v1/sandboxes/{id}/files/stat", get(stat))
        .with_state(fake.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(&sock) })
        .unwrap();
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    Daemon {
        fake,
        url: format!("unix://{}", sock.display()),
        dir,
        _rt: rt,
    }
}

impl Daemon {
    fn warren(&self, args: &[&str], stdin: &[u8]) -> Output {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
            .args(args)
            .env("WARREN_URL", &self.url)
            .current_dir(self.dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn create_prints_the_id_alone() {
    let d = start();
    let out = d.warren(
        &[
            "create", "-i", "base", "-i", "task:1", "-l", "run=42", "--ttl", "60",
        ],
        b"",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{ID}\n"));
    let req = d.fake.created.lock().unwrap()[0].clone();
    assert_eq!(req["image"], json!(["base", "task:1"]));
    assert_eq!(req["labels"], json!({"run": "42"}));
    assert_eq!(req["ttl_secs"], 60);
}

#[test]
fn exec_streams_bytes_and_exits_with_the_command() {
    let d = start();
    let out = d.warren(&["exec", ID, "--", "echo", "hi", "exit:3"], b"");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "echo hi exit:3||\n");
    assert_eq!(out.stderr, b"err\xff");

    let out = d.warren(&["exec", ID, "--", "x", "signal:9"], b"");
    assert_eq!(out.status.code(), Some(137));
    let out = d.warren(&["exec", ID, "--", "x", "timeout"], b"");
    assert_eq!(out.status.code(), Some(124));

    std::fs::write(d.path("in.txt"), "fed").unwrap();
    let out = d.warren(
        &["exec", ID, "--stdin-file", "in.txt", "-s", "--", "cat", "-"],
        b"",
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "sh -c cat -|fed|\n");

    // Piped stdin is streamed; -n leaves it alone.
    let out = d.warren(&["exec", ID, "--", "cat"], b"piped in");
    assert_eq!(text(&out.stdout), "cat|piped in|\n");
    let out = d.warren(&["exec", ID, "-n", "--", "cat"], b"piped in");
    assert_eq!(text(&out.stdout), "cat||\n");
    // --json: one ExecResult with the output, the command's exit code.
    let out = d.warren(&["exec", ID, "--json", "--", "echo", "exit:3"], b"");
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["encoding"], "base64", "stderr is not UTF-8: {v}");
}

#[test]
fn cp_both_ways_and_through_stdio() {
    let d = start();
    std::fs::write(d.path("task.py"), "print(42)\n").unwrap();
    std::fs::set_permissions(
        d.path("task.py"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // Into an existing directory: the file keeps its name and mode.
    let out = d.warren(&["cp", "./task.py", &format!("{ID}:/workspace/dir")], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        d.fake.files.lock().unwrap()["/workspace/dir/task.py|mode=493"],
        b"print(42)\n"
    );

    let out = d.warren(
        &["cp", "-", &format!("{ID}:/workspace/missing.txt")],
        b"from stdin",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        d.fake.files.lock().unwrap()["/workspace/missing.txt"],
        b"from stdin"
    );

    let out = d.warren(&["cp", &format!("{ID}:/workspace/missing.txt"), "."], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(d.path("missing.txt")).unwrap(), b"from stdin");

    let out = d.warren(&["cp", &format!("{ID}:/workspace/dir/task.py"), "-"], b"");
    assert_eq!(text(&out.stdout), "print(42)\n");

    let out = d.warren(&["cp", &format!("{ID}:/nope"), "x"], b"");
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("not_found"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.path("x").exists());

    let out = d.warren(&["cp", "a", "b"], b"");
    assert!(text(&out.stderr).contains("one side must be a sandbox path"));
}

#[test]
fn ls_rm_and_ps() {
    let d = start();
    let out = d.warren(&["ls"], b"");
    let table = text(&out.stdout);
    assert!(table.starts_with("ID "), "{table}");
    assert!(
        table.contains(&format!("{ID}  running  default")),
        "{table}"
    );
    assert!(table.contains("run=42"), "{table}");
    let out = d.warren(&["ls", "--json"], b"");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);

    // A sandbox that is already gone counts as deleted; a failed delete makes the exit 1.
    let out = d.warren(&["rm", "--all"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(d.fake.deleted.lock().unwrap().len(), 2);
    let out = d.warren(&["rm", ID, "n1-broken"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), format!("{ID}\n"));
    assert!(text(&out.stderr).contains("disk on fire"));

    let out = d.warren(&["ps", ID], b"");
    assert!(
        text(&out.stdout).contains("9    running  -     "),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn unreachable_daemon_is_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["--url", "unix:///nonexistent/w.sock", "health"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot connect to warrend at unix:///nonexistent/w.sock"),
        "{err}"
    );
    assert!(err.contains("warren up --detach"), "{err}");
    // Usage errors are warren's own failures too; --help documents the codes.
    let warren = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
            .args(args)
            .output()
            .unwrap()
    };
    assert_eq!(
        warren(&["create", "--memory", "lots"]).status.code(),
        Some(125)
    );
    let help = warren(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(text(&help.stdout).contains("125"), "{}", text(&help.stdout));
}
