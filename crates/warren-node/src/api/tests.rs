//! Router tests: malformed requests answer JSON errors with the right status and code (never
//! 500), and well-formed ones reach the manager.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use warren_types::{ErrorBody, ErrorCode, ExecResult, SandboxInfo};

use crate::testing::manager_in;

struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    /// The `Warren-Replayed` header was set.
    replayed: bool,
    body: Vec<u8>,
}

impl Answer {
    fn error(&self) -> ErrorBody {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not an error body ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("bad body ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    content_type: Option<&str>,
    body: &str,
) -> Answer {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let replayed = resp.headers().get(super::REPLAYED_HEADER).is_some();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        content_type,
        replayed,
        body,
    }
}

const JSON: Option<&str> = Some("application/json");

/// method, uri, content type, body, expected status, expected code.
type Case = (
    Method,
    String,
    Option<&'static str>,
    &'static str,
    u16,
    ErrorCode,
);

#[tokio::test]
async fn malformed_requests_answer_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));
    let created: SandboxInfo = call(&app, Method::POST, "/v1/sandboxes", JSON, "{}")
        .await
        .json();
    let sb = format!("/v1/sandboxes/{}", created.id);
    let cases: Vec<Case> = vec![
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            "{not json",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            r#"{"bogus":1}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            r#"{"memory_mb":-1}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            r#"{"cpus":1e9}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            r#"{"substrate":"vm"}"#,
            501,
            ErrorCode::UnsupportedSubstrate,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            Some("text/plain"),
            "{}",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            JSON,
            "[1,2]",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            "/v1/sandboxes/not-an-id".into(),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            "/v1/sandboxes/n1-..%2F..%2Fetc".into(),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            "/v1/sandboxes/n1-01jd0m7x4e8k0k9yq1w2e3r4t5".into(),
            None,
            "",
            404,
            ErrorCode::NotFound,
        ),
        (
            Method::DELETE,
            "/v1/sandboxes/n1-01jd0m7x4e8k0k9yq1w2e3r4t5".into(),
            None,
            "",
            404,
            ErrorCode::NotFound,
        ),
        (
            Method::GET,
            "/v1/sandboxes?state=sleeping".into(),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            "/v1/sandboxes?label=novalue".into(),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            "/v1/sandboxes?colour=red".into(),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/exec"),
            JSON,
            r#"{"argv":["x"],"nope":1}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/exec"),
            JSON,
            r#"{}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/exec"),
            JSON,
            r#"{"argv":["x"],"timeout_secs":-1}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/exec"),
            JSON,
            r#"{"argv":["x"],"cwd":"/../.."}"#,
            400,
            ErrorCode::InvalidPath,
        ),
        (
            Method::GET,
            format!("{sb}/files/stat?path=/../etc/passwd"),
            None,
            "",
            400,
            ErrorCode::InvalidPath,
        ),
        (
            Method::GET,
            format!("{sb}/files/stat?path=relative"),
            None,
            "",
            400,
            ErrorCode::InvalidPath,
        ),
        (
            Method::GET,
            format!("{sb}/files/stat?path=/a%00b"),
            None,
            "",
            400,
            ErrorCode::InvalidPath,
        ),
        (
            Method::GET,
            format!("{sb}/files/stat"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            format!("{sb}/files/stat?path=/missing"),
            None,
            "",
            404,
            ErrorCode::NotFound,
        ),
        (
            Method::GET,
            format!("{sb}/files?path=/../x"),
            None,
            "",
            400,
            ErrorCode::InvalidPath,
        ),
        (
            Method::PUT,
            format!("{sb}/files?path=/x&mode=abc"),
            None,
            "data",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::DELETE,
            format!("{sb}/files?path=/x&recursive=maybe"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/files/mkdir"),
            JSON,
            r#"{"path":"/../x"}"#,
            400,
            ErrorCode::InvalidPath,
        ),
        (
            Method::POST,
            format!("{sb}/files/chmod"),
            JSON,
            r#"{"path":"/x"}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/files/chmod"),
            JSON,
            r#"{"path":"/x","mode":-5}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            format!("{sb}/processes/abc"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            format!("{sb}/processes/0"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            format!("{sb}/processes/99"),
            None,
            "",
            404,
            ErrorCode::NotFound,
        ),
        (
            Method::POST,
            format!("{sb}/processes/42/wait?timeout_secs=soon"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/processes/42/wait?timeout_secs=0.1"),
            None,
            "",
            504,
            ErrorCode::Timeout,
        ),
        (
            Method::POST,
            format!("{sb}/processes/42/kill"),
            JSON,
            r#"{"signal":"TERM"}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/processes/42/kill"),
            JSON,
            r#"{"signal":99}"#,
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            format!("{sb}/pty"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/pty/attach"),
            None,
            "",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/pty/attach"),
            None,
            "{\"argv\":[\"sh\"],\"nope\":1}\n",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::POST,
            format!("{sb}/pty/attach"),
            None,
            "{\"cols\":0}\n",
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            Method::GET,
            "/v1/nothing".into(),
            None,
            "",
            404,
            ErrorCode::NotFound,
        ),
        (
            Method::PATCH,
            "/v1/sandboxes".into(),
            None,
            "",
            405,
            ErrorCode::InvalidRequest,
        ),
    ];
    for (method, uri, ct, body, status, code) in cases {
        let a = call(&app, method.clone(), &uri, ct, body).await;
        assert_eq!(
            a.status.as_u16(),
            status,
            "{method} {uri} {body}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(
            a.content_type.as_deref(),
            Some("application/json"),
            "{method} {uri}"
        );
        assert_eq!(a.error().error.code, code, "{method} {uri} {body}");
    }
}

#[tokio::test]
async fn well_formed_requests_reach_the_manager() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));

    let a = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        r#"{"idempotency_key":"k","labels":{"run":"1"}}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let info: SandboxInfo = a.json();
    // curl -d sends form-urlencoded; the body is still JSON.
    let b = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        Some("application/x-www-form-urlencoded"),
        r#"{"idempotency_key":"k","labels":{"run":"1"}}"#,
    )
    .await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(b.json::<SandboxInfo>().id, info.id);
    let sb = format!("/v1/sandboxes/{}", info.id);

    let h: serde_json::Value = call(&app, Method::GET, "/v1/health", None, "").await.json();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["node"], "n1");
    assert_eq!(
        h["substrates"],
        serde_json::json!(["container", "function"])
    );
    assert_eq!(h["sandboxes"], 1);

    let l: serde_json::Value = call(
        &app,
        Method::GET,
        "/v1/sandboxes?label=run%3D1&state=running",
        None,
        "",
    )
    .await
    .json();
    assert_eq!(l["sandboxes"].as_array().unwrap().len(), 1);
    let l: serde_json::Value = call(&app, Method::GET, "/v1/sandboxes?label=run=2", None, "")
        .await
        .json();
    assert_eq!(l["sandboxes"].as_array().unwrap().len(), 0);

    let r = call(
        &app,
        Method::POST,
        &format!("{sb}/exec"),
        JSON,
        r#"{"shell":"echo hi"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json::<ExecResult>().exit_code, Some(3));

    let s = call(
        &app,
        Method::POST,
        &format!("{sb}/exec/stream"),
        JSON,
        r#"{"argv":["x"]}"#,
    )
    .await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.content_type.as_deref(), Some("application/x-ndjson"));
    let lines: Vec<serde_json::Value> = String::from_utf8(s.body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.first().unwrap()["type"], "stdout");
    assert_eq!(lines.last().unwrap()["type"], "exit");
    assert_eq!(lines.last().unwrap()["result"]["exit_code"], 3);

    assert_eq!(
        call(&app, Method::GET, &format!("{sb}/processes"), None, "")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, Method::GET, &format!("{sb}/processes/42"), None, "")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        call(
            &app,
            Method::POST,
            &format!("{sb}/processes/42/kill"),
            None,
            ""
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(
            &app,
            Method::POST,
            &format!("{sb}/processes/42/kill"),
            JSON,
            r#"{"signal":15}"#
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );

    let up = call(
        &app,
        Method::PUT,
        &format!("{sb}/files?path=/tmp/f&mode=420"),
        Some("application/octet-stream"),
        "data",
    )
    .await;
    assert_eq!(up.status, StatusCode::NO_CONTENT);
    let down = call(
        &app,
        Method::GET,
        &format!("{sb}/files?path=/tmp/f"),
        None,
        "",
    )
    .await;
    assert_eq!(down.status, StatusCode::OK);
    assert_eq!(
        down.content_type.as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(down.body, b"data");
    let st: serde_json::Value = call(
        &app,
        Method::GET,
        &format!("{sb}/files/stat?path=/tmp/./f"),
        None,
        "",
    )
    .await
    .json();
    assert_eq!(st["name"], "/tmp/f");
    let ls: serde_json::Value = call(
        &app,
        Method::GET,
        &format!("{sb}/files/list?path=/tmp"),
        None,
        "",
    )
    .await
    .json();
    assert_eq!(ls["entries"].as_array().unwrap().len(), 1);
    assert_eq!(
        call(
            &app,
            Method::POST,
            &format!("{sb}/files/mkdir"),
            JSON,
            r#"{"path":"/d","parents":true}"#
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(
            &app,
            Method::POST,
            &format!("{sb}/files/chmod"),
            JSON,
            r#"{"path":"/d","mode":493}"#
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(
            &app,
            Method::DELETE,
            &format!("{sb}/files?path=/d&recursive=true"),
            None,
            ""
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );

    let metrics = call(&app, Method::GET, "/metrics", None, "").await;
    assert!(metrics.content_type.unwrap().starts_with("text/plain"));
    let text = String::from_utf8(metrics.body).unwrap();
    for line in [
        "warren_sandboxes{state=\"running\",substrate=\"container\"} 1\n",
        "warren_sandboxes{state=\"paused\",substrate=\"container\"} 0\n",
        "warren_exec_total 2\n",
        "warren_exec_duration_seconds_count{substrate=\"container\"} 2\n",
        "warren_sandbox_create_seconds_count{substrate=\"container\"} 1\n",
        "warren_sandbox_create_phase_seconds_count{substrate=\"container\",phase=\"network\"} 1\n",
        // By route template, never by raw path.
        "warren_http_requests_total{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\",status=\"200\"} 1\n",
        "warren_http_requests_total{method=\"POST\",route=\"/v1/sandboxes\",status=\"201\"} 1\n",
        "warren_sandboxes_cpus_requested 1",
        "warren_build_info{version=\"",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(!text.contains(&sb), "a raw path in the metrics:\n{text}");
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let missing = warren_edge::http_metrics::undocumented(&text, &doc);
    assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");

    assert_eq!(
        call(&app, Method::DELETE, &sb, None, "").await.status,
        StatusCode::NO_CONTENT
    );
    let gone = call(&app, Method::GET, &sb, None, "").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn steps_pause_fork_and_the_trajectory_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));
    let info: SandboxInfo = call(&app, Method::POST, "/v1/sandboxes", JSON, "{}")
        .await
        .json();
    let sb = format!("/v1/sandboxes/{}", info.id);
    let exec = format!("{sb}/exec");

    let a = call(
        &app,
        Method::POST,
        &exec,
        JSON,
        r#"{"shell":"echo a","step":0}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let first: ExecResult = a.json();
    assert!(!first.replayed && !a.replayed);
    let b = call(
        &app,
        Method::POST,
        &exec,
        JSON,
        r#"{"shell":"echo a","step":0}"#,
    )
    .await;
    assert_eq!(b.status, StatusCode::OK);
    assert!(b.replayed);
    assert!(b.json::<ExecResult>().replayed);
    let c = call(
        &app,
        Method::POST,
        &exec,
        JSON,
        r#"{"shell":"echo b","step":0}"#,
    )
    .await;
    assert_eq!(c.status, StatusCode::CONFLICT);
    assert_eq!(c.error().error.code, ErrorCode::StepConflict);
    assert_eq!(rt.shared.execs.load(std::sync::atomic::Ordering::SeqCst), 1);

    let put = |step: u64| format!("{sb}/files?path=/f&step={step}");
    let w = call(&app, Method::PUT, &put(1), None, "abc").await;
    assert_eq!(w.status, StatusCode::NO_CONTENT);
    let w = call(&app, Method::PUT, &put(1), None, "abc").await;
    assert_eq!(w.status, StatusCode::NO_CONTENT);
    assert!(w.replayed);
    let w = call(&app, Method::PUT, &put(1), None, "abd").await;
    assert_eq!(w.error().error.code, ErrorCode::StepConflict);
    let bad = call(
        &app,
        Method::PUT,
        &format!("{sb}/files?path=/f&step=x"),
        None,
        "",
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let mk = call(
        &app,
        Method::POST,
        &format!("{sb}/files/mkdir?step=2"),
        JSON,
        r#"{"path":"/d"}"#,
    )
    .await;
    assert_eq!(mk.status, StatusCode::NO_CONTENT);

    let p = call(&app, Method::POST, &format!("{sb}/pause"), None, "").await;
    assert_eq!(p.status, StatusCode::OK);
    let stats: serde_json::Value = p.json();
    assert_eq!(stats["memory_after_bytes"], 100);
    let got: SandboxInfo = call(&app, Method::GET, &sb, None, "").await.json();
    assert_eq!(got.state, warren_types::SandboxState::Paused);
    let r = call(&app, Method::POST, &format!("{sb}/resume"), None, "").await;
    assert_eq!(
        r.json::<SandboxInfo>().state,
        warren_types::SandboxState::Running
    );

    let f = call(
        &app,
        Method::POST,
        &format!("{sb}/fork"),
        JSON,
        r#"{"n":2,"labels":{"child":"1"}}"#,
    )
    .await;
    assert_eq!(f.status, StatusCode::CREATED);
    let kids: warren_types::ForkResult = f.json();
    assert_eq!(kids.sandboxes.len(), 2);
    for bad in [r#"{"n":0}"#, r#"{"n":65}"#, r#"{"n":1,"x":2}"#] {
        let e = call(&app, Method::POST, &format!("{sb}/fork"), JSON, bad).await;
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    // A fork naming a step runs once: the retry answers the same children.
    let stepped = format!("{sb}/fork?step=7");
    let one = call(&app, Method::POST, &stepped, JSON, r#"{"n":1}"#).await;
    let two = call(&app, Method::POST, &stepped, JSON, r#"{"n":1}"#).await;
    assert_eq!(
        (one.status, two.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!one.replayed && two.replayed);
    let ids = |r: &Answer| -> Vec<String> {
        let f: warren_types::ForkResult = r.json();
        f.sandboxes.into_iter().map(|s| s.id).collect()
    };
    assert_eq!(ids(&one), ids(&two));
    let low = call(
        &app,
        Method::POST,
        &format!("{sb}/fork?step=1"),
        JSON,
        r#"{"n":1}"#,
    )
    .await;
    assert_eq!(low.status, StatusCode::CONFLICT);

    let t = call(&app, Method::GET, &format!("{sb}/trajectory"), None, "").await;
    assert_eq!(t.status, StatusCode::OK);
    assert_eq!(t.content_type.as_deref(), Some("application/x-ndjson"));
    let lines: Vec<warren_types::TrajectoryEntry> = String::from_utf8(t.body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|e| e.call.kind()).collect();
    assert_eq!(
        kinds,
        [
            "exec",
            "write_file",
            "mkdir",
            "pause",
            "resume",
            "fork",
            "fork"
        ]
    );
    assert_eq!(
        lines[3].call,
        warren_types::TrajectoryCall::Pause { by: "call".into() }
    );
    assert_eq!(lines[3].step, None, "lifecycle entries take no step");
    let t = call(
        &app,
        Method::GET,
        &format!("{sb}/trajectory?from_seq=3"),
        None,
        "",
    )
    .await;
    // From entry 3 on: the mkdir, the pause, the resume and both forks.
    assert_eq!(String::from_utf8(t.body).unwrap().lines().count(), 5);
    let t = call(
        &app,
        Method::GET,
        &format!("{sb}/trajectory?seq=3"),
        None,
        "",
    )
    .await;
    assert_eq!(t.status, StatusCode::BAD_REQUEST);
    let kid = &kids.sandboxes[0].id;
    let t = call(
        &app,
        Method::GET,
        &format!("/v1/sandboxes/{kid}/trajectory"),
        None,
        "",
    )
    .await;
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8(t.body).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first["kind"], "forked_from");
    assert_eq!(first["request"]["parent"], info.id.as_str());
    // The parent's exec, write, mkdir, pause and resume.
    assert_eq!(first["request"]["parent_seq"], 5);
}

#[test]
fn routes_are_unique_and_all_served() {
    let mut seen = std::collections::HashSet::new();
    for r in super::ROUTES {
        assert!(seen.insert(r), "{r:?} listed twice");
    }
    // Building the router asserts every ROUTES entry has a handler and vice versa.
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (m, _) = manager_in(dir.path(), |_| {});
        let _ = super::router(crate::Node::new(m, None));
    });
}
