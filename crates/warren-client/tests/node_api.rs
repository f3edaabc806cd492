//! The client against the node's real router over its fake runtime (`warren-testkit`'s
//! `FakeDaemon`, on a Unix socket in a temp dir): URLs, JSON bodies, error mapping, NDJSON
//! streaming, streamed uploads and downloads, the terminal WebSocket, and connection reuse
//! under many concurrent calls. What the fake agent inside answers is described on
//! `warren_node::testing`. Answers no node gives (a plain-text error, a bare 405) come from a
//! tiny local server at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use warren_client::{
    Client, ClientError, CreateSandboxRequest, ErrorCode, ExecEvent, ExecRequest, FileKind,
    PtyEvent, SandboxState, Substrate,
};
use warren_testkit::FakeDaemon;

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

/// Starts the daemon; returns it with a client of at most `max_connections` connections.
async fn start(max_connections: usize) -> (Client, FakeDaemon) {
    let d = FakeDaemon::start().await;
    let client = Client::builder()
        .url(d.url())
        .max_connections(max_connections)
        .build()
        .unwrap();
    (client, d)
}

/// A sandbox of the daemon's, for calls that need one.
async fn sandbox(c: &Client) -> String {
    c.create(&CreateSandboxRequest::default()).await.unwrap().id
}

/// The fake agent's stdout: the command it ran, as JSON (its `argv`), then its stdin.
fn echoed(stdout: &str) -> (Vec<String>, String) {
    let mut it = serde_json::Deserializer::from_str(stdout).into_iter::<serde_json::Value>();
    let spec = it.next().expect("a JSON spec").expect("JSON");
    let rest = stdout[it.byte_offset()..].to_string();
    (serde_json::from_value(spec["argv"].clone()).unwrap(), rest)
}

#[tokio::test]
async fn json_round_trips() {
    let (c, d) = start(8).await;
    let h = c.health().await.unwrap();
    assert!(h.is_ok());
    // A node with a container runtime serves function sandboxes on it too.
    assert_eq!(h.substrates, ["container", "function"]);

    let mut req = CreateSandboxRequest {
        substrate: Substrate::Container,
        image: warren_client::ImageRef::Stack(vec!["default".into(), "task:1".into()]),
        ..Default::default()
    };
    req.labels.insert("job".into(), "7".into());
    let sb = c.create(&req).await.unwrap();
    assert_eq!(sb.image, ["default", "task:1"]);
    assert_eq!(sb.labels["job"], "7");
    let id = sb.id.clone();

    let got = c.get(&id).await.unwrap();
    assert_eq!(got.id, id);

    // A label whose value needs escaping: the query is encoded, and the node finds it.
    let labels: BTreeMap<String, String> = [("job".to_string(), "a b".to_string())].into();
    let other = CreateSandboxRequest {
        labels: labels.clone(),
        ..Default::default()
    };
    let other = c.create(&other).await.unwrap().id;
    let list = c.list(&labels, Some(SandboxState::Running)).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].id, other);
    assert!(
        d.requests()
            .contains(&"GET /v1/sandboxes?label=job%3Da%20b&state=running".to_string()),
        "{:#?}",
        d.requests()
    );
    c.delete(&other).await.unwrap();
    assert!(c.get(&other).await.unwrap_err().is_not_found());

    let r = c
        .exec(&id, &ExecRequest::argv(["echo", "hi"]))
        .await
        .unwrap();
    assert_eq!(echoed(&r.stdout).0, ["echo", "hi"]);
    assert_eq!((r.exit_code, r.stderr.as_str()), (Some(3), "err"));

    let p = c.spawn(&id, &ExecRequest::shell("sleep 9")).await.unwrap();
    assert_eq!((p.pid, p.argv.len()), (42, 3));
    let r = c.wait_process(&id, 5, None).await.unwrap();
    assert_eq!(r.exit_code, Some(5));
    c.kill_process(&id, 5, Some(15)).await.unwrap();
    assert_eq!(*d.runtime().shared.kills.lock().unwrap(), [(5, 15)]);

    let st = c.stat(&id, "/etc/hostname").await.unwrap();
    assert_eq!(st.name, "/etc/hostname");
}

#[tokio::test]
async fn error_bodies_map_to_typed_errors() {
    let (c, _d) = start(8).await;
    let e = c.get("n1-01jd0m7x4e8k0k9yq1w2e3r4t5").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.status(), Some(404));

    let id = sandbox(&c).await;
    // Pid 42 runs on: the wait ends at its timeout.
    let e = c
        .wait_process(&id, 42, Some(Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Timeout));
    assert_eq!(e.status(), Some(504));

    let e = c.read_file(&id, "/missing").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");

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
    let (c, _d) = start(8).await;
    let id = sandbox(&c).await;
    // Stdin comes back after the command: 512 KiB on one line of the stream, more than a
    // socket holds, so the line reaches the client in pieces.
    let big = "s".repeat(512 << 10);
    let mut req = ExecRequest::argv(["x"]);
    req.stdin = Some(big.clone());
    let stream = c.exec_stream(&id, &req).await.unwrap();
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
    let (argv, stdin) = echoed(&out);
    assert_eq!((argv, stdin == big), (vec!["x".to_string()], true));
    assert_eq!(err, "err");
    assert_eq!(result.exit_code, Some(3));

    let events: Vec<_> = c
        .exec_stream(&id, &ExecRequest::argv(["x", "exit:7"]))
        .await
        .unwrap()
        .collect()
        .await;
    assert!(events.len() >= 3, "{events:?}");
    assert!(
        matches!(events[0], Ok(ExecEvent::Stdout { .. })),
        "{events:?}"
    );
    match events.last() {
        Some(Ok(ExecEvent::Exit { result })) => assert_eq!(result.exit_code, Some(7)),
        other => panic!("the last event is the exit: {other:?}"),
    }
}

#[tokio::test]
async fn big_files_stream_both_ways() {
    let (c, d) = start(8).await;
    let id = sandbox(&c).await;

    // Upload 50 MiB generated on the fly: never held in memory as a whole.
    let chunks = (0..BIG.div_ceil(CHUNK as u64)).map(|i| {
        let start = i * CHUNK as u64;
        let len = (BIG - start).min(CHUNK as u64) as usize;
        Ok::<_, std::io::Error>(pattern_chunk(start, len))
    });
    c.write_file(&id, "/up/big", Some(0o600), futures::stream::iter(chunks))
        .await
        .unwrap();
    let st = c.stat(&id, "/up/big").await.unwrap();
    assert_eq!((st.size, st.mode, st.kind), (BIG, 0o600, FileKind::File));

    // Download it back chunk by chunk, checking each byte.
    let mut stream = c.read_file(&id, "/up/big").await.unwrap();
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
    let local = d.dir().join("down");
    assert_eq!(c.download_to(&id, "/up/big", &local).await.unwrap(), BIG);
    std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o751)).unwrap();
    assert_eq!(
        c.upload_from(&id, &local, "/up/copy", None).await.unwrap(),
        BIG
    );
    {
        let files = d.files(&id);
        let files = files.lock().unwrap();
        let copy = &files["/up/copy"];
        assert_eq!((copy.data.len() as u64, copy.mode), (BIG, Some(0o751)));
        assert!(copy
            .data
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i as u64)));
    }

    // A failed download leaves no partial file behind.
    let missing = d.dir().join("missing");
    assert!(c.download_to(&id, "/missing", &missing).await.is_err());
    assert!(!missing.exists());

    let small = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from("small file\n"))]);
    c.write_file(&id, "/small", None, small).await.unwrap();
    assert_eq!(
        c.read_file_bytes(&id, "/small").await.unwrap(),
        "small file\n"
    );
    let reader = tokio::io::BufReader::new(&b"xyz"[..]);
    c.write_file_from(&id, "/up/r", None, reader).await.unwrap();
    assert_eq!(d.files(&id).lock().unwrap()["/up/r"].data, "xyz");
}

#[tokio::test]
async fn terminal_over_websocket() {
    let (c, _d) = start(8).await;
    let id = sandbox(&c).await;
    let mut pty = c.pty(&id, "/bin/bash -l", 80, 24).await.unwrap();
    let out = |ev: Option<PtyEvent>| match ev {
        Some(PtyEvent::Output(b)) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("expected output, got {other:?}"),
    };
    // A command line runs under the shell.
    assert_eq!(
        out(pty.next_event().await.unwrap()),
        "/bin/sh -c /bin/bash -l 80x24"
    );
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

    let e = c.pty(&id, "sh", 80, 24).await.map(|_| ());
    assert!(e.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_calls_share_few_connections() {
    let (c, d) = start(32).await;
    let calls = (0..3000).map(|_| {
        let c = c.clone();
        tokio::spawn(async move { c.health().await })
    });
    for r in futures::future::join_all(calls).await {
        assert!(r.unwrap().unwrap().is_ok());
    }
    // At most 32 requests are in flight; a connection on its way back to the pool may be
    // replaced by a new one, so allow some slack, but nothing near one per call.
    let opened = d.connections();
    assert!(opened <= 64, "opened {opened} connections for 3000 calls");
}

/// Answers no node gives, so a local server makes them: a proxy's plain-text `502`, and
/// axum's bare `405` (no JSON body) for a route served for another method only.
#[tokio::test]
async fn answers_without_a_json_error_are_plain_status_errors() {
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("warren.sock");
    let app = axum::Router::new()
        .route(
            "/v1/sandboxes/{id}",
            get(|| async { (StatusCode::BAD_GATEWAY, "upstream fell over") }),
        )
        .route(
            "/v1/sandboxes/{id}/processes",
            post(|| async { StatusCode::CREATED }),
        );
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = Client::new(&format!("unix://{}", sock.display())).unwrap();

    let e = c.get("n1-plain").await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Status { status: 502, body } if body == "upstream fell over"),
        "{e:?}"
    );
    let e = c.list_processes("n1-x").await.unwrap_err();
    assert_eq!(e.status(), Some(405));
}
