//! The API answers alike wherever the same thing happens: an empty argv is the same 400 on
//! every command route; a program that does not exist is the same answer (exit 127, the
//! reason on stderr, as a shell says) from exec, streamed exec, attached exec, a background
//! process and a function call; an empty body writes an empty file, and a tar, image or build
//! context with no body is the same 400. (A wrong method's 405 is checked on every path by the
//! router tests of warren-node and warren-gateway.)

use serde_json::Value;

use crate::common::{raw_request_with, Daemon};

const JSON: Option<&str> = Some("application/json");

/// The error body's code, after checking the answer is the API's JSON error shape.
fn error_code(what: &str, status: u16, headers: &hyper::HeaderMap, body: &[u8]) -> String {
    let ct = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(
        ct.starts_with("application/json"),
        "{what}: {status} with content type {ct:?}: {}",
        String::from_utf8_lossy(body)
    );
    let v: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", String::from_utf8_lossy(body)));
    let code = v["error"]["code"].as_str();
    let message = v["error"]["message"].as_str();
    assert!(
        code.is_some() && message.is_some_and(|m| !m.is_empty()),
        "{what}: not the error shape: {v}"
    );
    code.unwrap().to_string()
}

/// The exit and stderr a command's answer reports.
fn exit_and_stderr(v: &Value) -> (Option<i64>, String) {
    (
        v["exit_code"].as_i64(),
        v["stderr"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argv_and_missing_programs_get_one_answer_on_every_command_route() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let sb = format!("/v1/sandboxes/{id}");
    let post = |path: String, body: String| {
        let socket = d.socket.clone();
        async move { raw_request_with(&socket, "POST", &path, JSON, &[], body).await }
    };

    // An empty argv, or one naming no program: the same 400 everywhere.
    for argv in [r#"[]"#, r#"[""]"#] {
        let routes = [
            (format!("{sb}/exec"), format!("{{\"argv\":{argv}}}")),
            (format!("{sb}/exec/stream"), format!("{{\"argv\":{argv}}}")),
            (
                format!("{sb}/exec/attach"),
                format!("{{\"argv\":{argv}}}\n"),
            ),
            (format!("{sb}/processes"), format!("{{\"argv\":{argv}}}")),
            ("/v1/functions/call".into(), format!("{{\"argv\":{argv}}}")),
        ];
        for (path, body) in routes {
            let what = format!("POST {path} {}", body.trim());
            let (status, headers, resp) = post(path, body).await;
            assert_eq!(status, 400, "{what}: {}", String::from_utf8_lossy(&resp));
            assert_eq!(
                error_code(&what, status, &headers, &resp),
                "invalid_request",
                "{what}"
            );
        }
    }

    // A program that does not exist: a result saying so, as a shell would, everywhere.
    let missing = r#"{"argv":["/no/such/program","x"]}"#;
    let mut answers = Vec::new();
    let (status, _, resp) = post(format!("{sb}/exec"), missing.into()).await;
    assert_eq!(status, 200, "exec: {}", String::from_utf8_lossy(&resp));
    answers.push((
        "exec",
        exit_and_stderr(&serde_json::from_slice(&resp).unwrap()),
    ));
    for (route, body) in [
        ("exec/stream", missing.to_string()),
        ("exec/attach", format!("{missing}\n")),
    ] {
        let (status, _, resp) = post(format!("{sb}/{route}"), body).await;
        let text = String::from_utf8_lossy(&resp).to_string();
        assert_eq!(status, 200, "{route}: {text}");
        let mut stderr = String::new();
        let mut exit = None;
        for line in text.lines() {
            let ev: Value = serde_json::from_str(line).unwrap();
            match ev["type"].as_str() {
                Some("stderr") => stderr.push_str(ev["data"].as_str().unwrap()),
                Some("exit") => exit = ev["result"]["exit_code"].as_i64(),
                _ => panic!("{route}: unexpected event {ev}"),
            }
        }
        answers.push((route, (exit, stderr)));
    }
    let (status, _, resp) = post(format!("{sb}/processes"), missing.into()).await;
    assert_eq!(status, 201, "spawn: {}", String::from_utf8_lossy(&resp));
    let pid = serde_json::from_slice::<Value>(&resp).unwrap()["pid"]
        .as_u64()
        .expect("a pid");
    let (status, _, resp) = post(
        format!("{sb}/processes/{pid}/wait?timeout_secs=30"),
        String::new(),
    )
    .await;
    assert_eq!(status, 200, "wait: {}", String::from_utf8_lossy(&resp));
    answers.push((
        "spawn, then wait",
        exit_and_stderr(&serde_json::from_slice(&resp).unwrap()),
    ));
    let (status, _, resp) = post("/v1/functions/call".into(), missing.into()).await;
    assert_eq!(status, 200, "call: {}", String::from_utf8_lossy(&resp));
    answers.push((
        "call",
        exit_and_stderr(&serde_json::from_slice(&resp).unwrap()),
    ));
    for (route, (exit, stderr)) in &answers {
        assert_eq!(*exit, Some(127), "{route}: {stderr}");
        assert!(
            stderr.starts_with("warren: cannot run /no/such/program: "),
            "{route}: {stderr:?}"
        );
    }
    assert_eq!(d.sh_ok(&id, "echo fine").await, "fine\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_uploads_get_one_answer() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let sb = format!("/v1/sandboxes/{id}");
    // A file: an empty body is an empty file (as `touch`), with or without a length.
    for (n, headers) in [
        (1, vec![("content-length", "0")]),
        (2, vec![("transfer-encoding", "chunked")]),
    ] {
        let path = format!("{sb}/files?path=/tmp/empty-{n}");
        let (status, _, resp) = raw_request_with(
            &d.socket,
            "PUT",
            &path,
            Some("application/octet-stream"),
            &headers,
            Vec::new(),
        )
        .await;
        assert_eq!(
            status,
            204,
            "PUT {path}: {}",
            String::from_utf8_lossy(&resp)
        );
        let st = d
            .client()
            .stat(&id, &format!("/tmp/empty-{n}"))
            .await
            .unwrap();
        assert_eq!(st.size, 0);
    }
    // A tar, an image or a build context: no body is a 400, the same on each.
    for (method, path, ct) in [
        (
            "PUT",
            format!("{sb}/files/tar?path=/tmp"),
            "application/x-tar",
        ),
        (
            "POST",
            "/v1/images/import?tag=empty-import".into(),
            "application/x-tar",
        ),
        (
            "POST",
            "/v1/images/build?tag=empty-build".into(),
            "application/x-tar",
        ),
    ] {
        let what = format!("{method} {path} (no body)");
        let (status, headers, resp) =
            raw_request_with(&d.socket, method, &path, Some(ct), &[], Vec::new()).await;
        assert_eq!(status, 400, "{what}: {}", String::from_utf8_lossy(&resp));
        assert_eq!(
            error_code(&what, status, &headers, &resp),
            "invalid_request",
            "{what}"
        );
    }
    let images = d.client().images().await.unwrap();
    assert!(
        !images.iter().any(|i| i.reference.starts_with("empty-")),
        "an empty upload tagged an image"
    );
}
