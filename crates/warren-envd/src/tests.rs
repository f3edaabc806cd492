//! `Envd::serve` end to end over a stand-in of the v1 router that answers the attached exec
//! as Warren's does (NDJSON events of base64 output, then the exit): what the framing, the
//! command registry and the error shapes do. The real node is driven by the E2B SDK's tests.

use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::routing::post;
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use warren_types::{Caller, ExecEvent, ExecRequest, ExecResult};

use crate::connect::{envelope, FLAG_COMPRESSED, FLAG_END_STREAM};
use crate::Envd;

/// `cat` echoes stdin as stdout and exits 0 when stdin ends; `fail` writes to stderr and
/// exits 3; anything else runs until the call is dropped. Also the streamed exec (a start
/// without stdin): its body is the request alone, no newline, and stdin is empty.
async fn attach(Path(_id): Path<String>, req: Request) -> Response {
    assert!(
        req.extensions().get::<Caller>().is_some(),
        "the caller rides along"
    );
    let mut body = req.into_body().into_data_stream();
    let mut head = Vec::new();
    let mut rest = Bytes::new();
    while let Some(Ok(c)) = body.next().await {
        if let Some(nl) = c.iter().position(|b| *b == b'\n') {
            head.extend_from_slice(&c[..nl]);
            rest = c.slice(nl + 1..);
            break;
        }
        head.extend_from_slice(&c);
    }
    let exec: ExecRequest = serde_json::from_slice(&head).unwrap();
    let prog = exec.argv.unwrap()[0].clone();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let line = |ev: &ExecEvent| {
        let mut l = serde_json::to_vec(ev).unwrap();
        l.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(l))
    };
    let exit = move |code| ExecEvent::Exit {
        result: ExecResult {
            exit_code: Some(code),
            ..Default::default()
        },
    };
    let events: futures::stream::BoxStream<'static, _> = match prog.as_str() {
        "cat" => {
            let first = futures::stream::iter((!rest.is_empty()).then(|| rest.to_vec()));
            let more = body.filter_map(|c| async move { c.ok().map(|c| c.to_vec()) });
            first
                .chain(more)
                .map(move |c| line(&ExecEvent::Stdout { data: b64(&c) }))
                .chain(futures::stream::once(async move { line(&exit(0)) }))
                .boxed()
        }
        "fail" => futures::stream::iter([
            line(&ExecEvent::Stderr {
                data: b64(b"bad\n"),
            }),
            line(&exit(3)),
        ])
        .boxed(),
        _ => futures::stream::pending().boxed(),
    };
    Response::new(Body::from_stream(events))
}

/// A terminal that echoes what is typed, says when it is resized and exits on `exit`.
async fn pty_attach(Path(_id): Path<String>, req: Request) -> Response {
    use warren_types::{PtyAttachRequest, PtyClientLine, PtyServerLine};
    let body = req.into_body().into_data_stream();
    let lines =
        futures::stream::unfold((body, Vec::<u8>::new()), |(mut body, mut buf)| async move {
            loop {
                if let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    return Some((line, (body, buf)));
                }
                buf.extend_from_slice(&body.next().await?.ok()?);
            }
        });
    let mut lines = Box::pin(lines);
    let head: PtyAttachRequest = serde_json::from_slice(&lines.next().await.unwrap()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let out = |l: &PtyServerLine| {
        let mut v = serde_json::to_vec(l).unwrap();
        v.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(v))
    };
    let hello = format!(
        "{}x{} {}\n",
        head.cols,
        head.rows,
        head.argv.unwrap().join(" ")
    );
    let first = out(&PtyServerLine::Output {
        data: b64.encode(hello),
    });
    let rest = lines
        .map(
            move |l| match serde_json::from_slice::<PtyClientLine>(&l).unwrap() {
                PtyClientLine::Input { data } if b64.decode(&data).unwrap() == b"exit\n" => {
                    PtyServerLine::Exit {
                        exit_code: Some(0),
                        signal: None,
                    }
                }
                PtyClientLine::Input { data } => PtyServerLine::Output { data },
                PtyClientLine::Resize { cols, rows } => PtyServerLine::Output {
                    data: b64.encode(format!("resized {cols}x{rows}\n")),
                },
            },
        )
        .scan(false, move |ended, l| {
            if *ended {
                return futures::future::ready(None);
            }
            *ended = matches!(l, PtyServerLine::Exit { .. });
            futures::future::ready(Some(out(&l)))
        });
    Response::new(Body::from_stream(
        futures::stream::once(async { first }).chain(rest),
    ))
}

fn envd() -> Envd {
    Envd::new(
        axum::Router::new()
            .route("/v1/sandboxes/{id}/exec/attach", post(attach))
            .route("/v1/sandboxes/{id}/exec/stream", post(attach))
            .route("/v1/sandboxes/{id}/pty/attach", post(pty_attach))
            // Every path is an empty directory.
            .route(
                "/v1/sandboxes/{id}/files/stat",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({
                        "name": "/d", "kind": "dir", "size": 0, "mode": 0o755,
                        "uid": 0, "gid": 0, "mtime_ms": 0
                    }))
                }),
            )
            .route(
                "/v1/sandboxes/{id}/files/list",
                axum::routing::get(|| async { axum::Json(serde_json::json!({"entries": []})) }),
            ),
    )
}

fn rpc(path: &str, ct: &str, body: impl Into<Body>) -> Request {
    Request::post(path)
        .header(header::CONTENT_TYPE, ct)
        .body(body.into())
        .unwrap()
}

fn start(cmd: &str, stdin: bool) -> Request {
    let msg = serde_json::json!({"process": {"cmd": cmd, "args": []}, "stdin": stdin});
    rpc(
        "/process.Process/Start",
        "application/connect+json",
        envelope(0, msg.to_string().as_bytes()),
    )
}

/// The JSON messages of a streamed answer, the end-of-stream message last.
async fn messages(r: Response) -> Vec<serde_json::Value> {
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let mut out = Vec::new();
    let mut b = &bytes[..];
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        out.push(serde_json::from_slice(&b[5..5 + len]).unwrap());
        b = &b[5 + len..];
    }
    assert!(b.is_empty());
    out
}

async fn serve(e: &Envd, req: Request) -> Response {
    e.serve("sb1", Caller::admin(), None, req).await
}

#[tokio::test]
async fn start_streams_output_and_the_exit() {
    let e = envd();
    let r = serve(&e, start("fail", false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "application/connect+json"
    );
    let m = messages(r).await;
    assert!(m[0]["event"]["start"]["pid"].as_u64().unwrap() >= 1000);
    assert_eq!(m[1]["event"]["data"]["stderr"], "YmFkCg==");
    assert_eq!(m[2]["event"]["end"]["exitCode"], 3);
    assert_eq!(m[2]["event"]["end"]["exited"], true);
    assert_eq!(m[3], serde_json::json!({}));
}

#[tokio::test]
async fn stdin_reaches_a_command_and_closing_it_ends_the_command() {
    let e = envd();
    let r = serve(&e, start("cat", true)).await;
    let mut body = r.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&first[5..]).unwrap();
    let pid = v["event"]["start"]["pid"].as_u64().unwrap();

    // Listed while it runs.
    let l = serve(&e, rpc("/process.Process/List", "application/json", "{}")).await;
    let l: serde_json::Value =
        serde_json::from_slice(&l.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(l["processes"][0]["pid"], pid);

    let input = serde_json::json!({"process": {"pid": pid}, "input": {"stdin": "aGkK"}});
    let r = serve(
        &e,
        rpc(
            "/process.Process/SendInput",
            "application/json",
            input.to_string(),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let close = serde_json::json!({"process": {"pid": pid}});
    let r = serve(
        &e,
        rpc(
            "/process.Process/CloseStdin",
            "application/json",
            close.to_string(),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let rest: Vec<u8> = body.map(|c| c.unwrap().to_vec()).concat().await;
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains(r#""stdout":"aGkK""#), "{text}");
    assert!(text.contains(r#""exitCode":0"#), "{text}");
}

#[tokio::test]
async fn a_dropped_stream_can_be_reconnected_and_the_command_killed() {
    let e = envd();
    let r = serve(&e, start("sleep", false)).await;
    let mut body = r.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&first[5..]).unwrap();
    let pid = v["event"]["start"]["pid"].as_u64().unwrap();
    drop(body);

    let sel = serde_json::json!({"process": {"pid": pid}});
    let conn = rpc(
        "/process.Process/Connect",
        "application/connect+json",
        envelope(0, sel.to_string().as_bytes()),
    );
    let r = serve(&e, conn).await;
    let kill = serde_json::json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
    let k = serve(
        &e,
        rpc(
            "/process.Process/SendSignal",
            "application/json",
            kill.to_string(),
        ),
    )
    .await;
    assert_eq!(k.status(), StatusCode::OK);
    let m = messages(r).await;
    assert_eq!(m[0]["event"]["start"]["pid"], pid);
    assert_eq!(m[1]["event"]["end"]["exitCode"], -1);
    assert_eq!(m[1]["event"]["end"]["status"], "signal: killed");

    // Gone now: the SDK's kill() reads not_found as "was not running".
    let k = serve(
        &e,
        rpc(
            "/process.Process/SendSignal",
            "application/json",
            kill.to_string(),
        ),
    )
    .await;
    assert_eq!(k.status(), StatusCode::NOT_FOUND);
    let body: serde_json::Value =
        serde_json::from_slice(&k.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["code"], "not_found");
}

#[tokio::test]
async fn malformed_frames_answer_connect_errors() {
    let e = envd();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            envelope(0, b"{\"process\":")[..8].to_vec(),
            "invalid_argument",
        ),
        (vec![0, 0xff, 0xff, 0xff, 0xff], "resource_exhausted"),
        (envelope(FLAG_COMPRESSED, b"{}").to_vec(), "internal"),
        (
            envelope(FLAG_END_STREAM, b"{}").to_vec(),
            "invalid_argument",
        ),
        (envelope(0x40, b"{}").to_vec(), "invalid_argument"),
        (envelope(0, b"not json").to_vec(), "invalid_argument"),
        (Vec::new(), "invalid_argument"),
    ];
    for (body, code) in cases {
        let r = serve(
            &e,
            rpc(
                "/process.Process/Start",
                "application/connect+json",
                body.clone(),
            ),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK, "{body:?}");
        let m = messages(r).await;
        assert_eq!(m.last().unwrap()["error"]["code"], code, "{body:?}");
    }
    // Unary: the status and the JSON error.
    let r = serve(
        &e,
        rpc("/process.Process/SendInput", "application/json", "[1,2"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = serve(&e, rpc("/process.Process/Nope", "application/json", "{}")).await;
    assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
    let r = serve(&e, rpc("/process.Process/List", "text/plain", "{}")).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = serve(
        &e,
        rpc(
            "/process.Process/List",
            "application/proto",
            Bytes::from_static(&[0xff]),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = serve(&e, rpc("/elsewhere", "application/json", "{}")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let h = serve(&e, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(h.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn protobuf_calls_are_answered_in_protobuf() {
    use prost::Message;
    let e = envd();
    let req = crate::pb::process::StartRequest {
        process: Some(crate::pb::process::ProcessConfig {
            cmd: "fail".into(),
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let r = serve(
        &e,
        rpc(
            "/process.Process/Start",
            "application/connect+proto",
            envelope(0, &req.encode_to_vec()),
        ),
    )
    .await;
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "application/connect+proto"
    );
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    let first = crate::pb::process::EventResponse::decode(&bytes[5..5 + len]).unwrap();
    assert!(matches!(
        first.event.and_then(|e| e.event),
        Some(crate::pb::process::Event::Start(_))
    ));
    // The end-of-stream message is JSON in every encoding.
    assert!(bytes.ends_with(b"\x02\x00\x00\x00\x02{}"));
}

#[tokio::test]
async fn a_terminal_takes_input_and_resizes() {
    let e = envd();
    let msg = serde_json::json!({
        "process": {"cmd": "/bin/bash", "args": ["-i", "-l"]},
        "pty": {"size": {"cols": 100, "rows": 30}},
    });
    let r = serve(
        &e,
        rpc(
            "/process.Process/Start",
            "application/connect+json",
            envelope(0, msg.to_string().as_bytes()),
        ),
    )
    .await;
    let mut body = r.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&first[5..]).unwrap();
    let pid = v["event"]["start"]["pid"].as_u64().unwrap();
    let input = |d: &str| {
        let b = base64::engine::general_purpose::STANDARD.encode(d);
        serde_json::json!({"process": {"pid": pid}, "input": {"pty": b}}).to_string()
    };
    let r = serve(
        &e,
        rpc(
            "/process.Process/SendInput",
            "application/json",
            input("ls\n"),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let resize =
        serde_json::json!({"process": {"pid": pid}, "pty": {"size": {"cols": 120, "rows": 40}}});
    let r = serve(
        &e,
        rpc(
            "/process.Process/Update",
            "application/json",
            resize.to_string(),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    // A terminal's input is not closed (Ctrl-D is how).
    let close = serde_json::json!({"process": {"pid": pid}}).to_string();
    let r = serve(
        &e,
        rpc("/process.Process/CloseStdin", "application/json", close),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = serve(
        &e,
        rpc(
            "/process.Process/SendInput",
            "application/json",
            input("exit\n"),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let rest: Vec<u8> = body.map(|c| c.unwrap().to_vec()).concat().await;
    let mut m = Vec::new();
    let mut b = &rest[..];
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        m.push(serde_json::from_slice::<serde_json::Value>(&b[5..5 + len]).unwrap());
        b = &b[5 + len..];
    }
    let screen: String = m
        .iter()
        .filter_map(|v| v["event"]["data"]["pty"].as_str())
        .map(|d| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(d).unwrap()).unwrap()
        })
        .collect();
    assert_eq!(screen, "100x30 /bin/bash -i -l\nls\nresized 120x40\n");
    assert_eq!(m[m.len() - 2]["event"]["end"]["exitCode"], 0);
    assert_eq!(m[m.len() - 1], serde_json::json!({}));
}

/// Polling watchers: one sandbox holds at most its share, and the watchers sandboxes leave
/// behind (a sandbox that times out removes none) never refuse a new one of another.
#[tokio::test]
async fn watchers_are_bounded_per_sandbox_and_leftovers_make_room() {
    use crate::filesystem::{MAX_WATCHERS, MAX_WATCHERS_PER_SANDBOX};
    let e = envd();
    let create = |sb: String| {
        let e = e.clone();
        async move {
            let r = e
                .serve(
                    &sb,
                    Caller::admin(),
                    None,
                    rpc(
                        "/filesystem.Filesystem/CreateWatcher",
                        "application/json",
                        r#"{"path": "/d"}"#,
                    ),
                )
                .await;
            let status = r.status();
            let b = r.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
            (status, v)
        }
    };
    let poll = |sb: &'static str, id: String| {
        let e = e.clone();
        async move {
            let body = serde_json::json!({ "watcherId": id }).to_string();
            e.serve(
                sb,
                Caller::admin(),
                None,
                rpc(
                    "/filesystem.Filesystem/GetWatcherEvents",
                    "application/json",
                    body,
                ),
            )
            .await
            .status()
        }
    };
    // One sandbox: its share, then resource_exhausted.
    let mut first = String::new();
    for i in 0..MAX_WATCHERS_PER_SANDBOX {
        let (s, v) = create("hog".into()).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if i == 0 {
            first = v["watcherId"].as_str().unwrap().to_string();
        }
    }
    let (s, v) = create("hog".into()).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["code"], "resource_exhausted");
    // Fill the node with watchers of sandboxes that went away (never polled again), the
    // hog's first kept fresh by a poll.
    assert_eq!(poll("hog", first.clone()).await, StatusCode::OK);
    let mut made = MAX_WATCHERS_PER_SANDBOX;
    let mut n = 0;
    while made < MAX_WATCHERS {
        let (s, v) = create(format!("gone-{}", n / MAX_WATCHERS_PER_SANDBOX)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        made += 1;
        n += 1;
    }
    // A new sandbox still gets its watcher; the polled one survived.
    let (s, v) = create("new".into()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(poll("hog", first).await, StatusCode::OK);
}

/// Streaming directory watches: one sandbox holds at most its share open at once, a watch
/// whose client went away gives its slot back, and another sandbox is never refused for it.
#[tokio::test]
async fn watch_streams_are_bounded_per_sandbox() {
    use crate::filesystem::MAX_WATCH_STREAMS_PER_SANDBOX;
    let e = envd();
    let watch = |sb: &'static str| {
        let e = e.clone();
        async move {
            e.serve(
                sb,
                Caller::admin(),
                None,
                rpc(
                    "/filesystem.Filesystem/WatchDir",
                    "application/connect+json",
                    envelope(0, br#"{"path": "/d"}"#),
                ),
            )
            .await
        }
    };
    let started = |(flag, v): (u8, serde_json::Value)| flag == 0 && v["start"].is_object();
    let mut open = Vec::new();
    for _ in 0..MAX_WATCH_STREAMS_PER_SANDBOX {
        let mut body = watch("hog").await.into_body().into_data_stream();
        assert!(started(first_message(&mut body).await));
        open.push(body);
    }
    let mut refused = watch("hog").await.into_body().into_data_stream();
    let (flag, end) = first_message(&mut refused).await;
    assert_eq!(flag, FLAG_END_STREAM, "{end}");
    assert_eq!(end["error"]["code"], "resource_exhausted", "{end}");
    // Another sandbox is not held to the hog's count.
    let mut other = watch("other").await.into_body().into_data_stream();
    assert!(started(first_message(&mut other).await));
    // A client that goes away (its answer dropped) frees its slot.
    drop(open.pop());
    let mut again = watch("hog").await.into_body().into_data_stream();
    assert!(
        started(first_message(&mut again).await),
        "a freed slot is reused"
    );
}

/// The first envelope of a streamed answer: its flags and its JSON message.
async fn first_message(body: &mut axum::body::BodyDataStream) -> (u8, serde_json::Value) {
    let mut buf = Vec::new();
    loop {
        if buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() >= 5 + len {
                return (buf[0], serde_json::from_slice(&buf[5..5 + len]).unwrap());
            }
        }
        let chunk = body.next().await.expect("the stream ended").unwrap();
        buf.extend_from_slice(&chunk);
    }
}
