//! `/v1/sandboxes/{id}/ports/{port}/...`: HTTP to a server listening inside a container
//! sandbox, with and without a network policy; bodies both ways, the path and query as
//! written, Warren's token kept out, an upgrade spliced, a paused sandbox resumed, typed
//! errors (bad port, nothing listening, another tenant's sandbox), and nothing left behind in
//! the daemon (no thread in a sandbox's namespace, no descriptor).

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_client::{CreateSandboxRequest, ExecRequest, SandboxState};

use crate::common::{raw_request_with, wait_for, Daemon};

/// A server on `http.server`: GET serves `/srv`, POST echoes the body with what it saw of
/// the request in headers, `GET /upgrade` switches to a byte echo.
const SERVER: &str = r#"
import http.server, os, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        for h in ["Host", "Authorization", "X-Forwarded-Prefix", "X-Custom"]:
            self.send_header("X-Seen-" + h, self.headers.get(h, "none"))
        self.send_header("X-Seen-Path", self.path)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path != "/upgrade":
            return super().do_GET()
        self.send_response(101)
        self.send_header("Upgrade", "echo")
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.flush()
        while True:
            b = self.rfile.read1(65536)
            if not b:
                break
            self.wfile.write(b)
            self.wfile.flush()
        self.close_connection = True
    def log_message(self, *a):
        pass
os.chdir("/srv")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

fn port_path(id: &str, port: u16, rest: &str) -> String {
    format!("/v1/sandboxes/{id}/ports/{port}{rest}")
}

async fn request(
    d: &Daemon,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<bytes::Bytes>,
) -> (u16, hyper::HeaderMap, bytes::Bytes) {
    raw_request_with(&d.socket, method, path, None, headers, body).await
}

/// Puts `/srv/hello.txt` and the server script into sandbox `id` and starts `cmd` in the
/// background; waits until `port` answers.
async fn serve(d: &Daemon, id: &str, cmd: &str, port: u16) {
    d.sh_ok(
        id,
        &format!(
            "mkdir -p /srv/sub && echo hello > /srv/hello.txt && echo deep > /srv/sub/f.txt \
             && cat > /tmp/server.py <<'EOF'\n{SERVER}\nEOF"
        ),
    )
    .await;
    d.client()
        .spawn(id, &ExecRequest::shell(cmd))
        .await
        .expect("starting the server");
    let path = port_path(id, port, "/hello.txt");
    let up = wait_for(Duration::from_secs(30), || async {
        let (status, _, _) = request(d, "GET", &path, &[], bytes::Bytes::new()).await;
        (status == 200).then_some(())
    })
    .await;
    assert!(up.is_some(), "the server on port {port} never answered");
}

/// Threads of the daemon whose network namespace is not the daemon's, and its open
/// descriptors.
fn daemon_threads_elsewhere_and_fds(pid: u32) -> (Vec<String>, usize) {
    let own = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let mut elsewhere = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        if let Ok(ns) = std::fs::read_link(t.join("ns/net")) {
            if ns != own {
                elsewhere.push(format!("{} in {}", t.display(), ns.display()));
            }
        }
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (elsewhere, fds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reaches_servers_inside_containers_with_and_without_a_network() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let bare = d.sandbox().await;
    serve(&d, &bare, "python3 /tmp/server.py 8000", 8000).await;
    let pid = d.pid().unwrap();

    // GET a file, and the bare port path (the server's root: a directory listing).
    let (status, _, body) =
        request(&d, "GET", &port_path(&bare, 8000, "/sub/f.txt"), &[], "").await;
    assert_eq!((status, &body[..]), (200, &b"deep\n"[..]));
    let (status, _, body) = request(&d, "GET", &port_path(&bare, 8000, ""), &[], "").await;
    assert!(status == 200 && String::from_utf8_lossy(&body).contains("hello.txt"));
    let (status, _, _) = request(&d, "GET", &port_path(&bare, 8000, "/missing"), &[], "").await;
    assert_eq!(status, 404, "the server's own answers pass unchanged");

    // POST a body: it arrives whole, the path and query as written, Warren's token dropped,
    // other headers kept.
    let big: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i % 251) as u8).collect();
    let (status, h, body) = request(
        &d,
        "POST",
        &port_path(&bare, 8000, "/echo/a%20b?x=1&y=%2F"),
        &[
            ("authorization", "Bearer warren-token"),
            ("x-custom", "kept"),
        ],
        big.clone(),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(h["warren-port"], "8000", "the server's answers are marked");
    assert!(body[..] == big[..], "the body came back whole");
    let seen = |name: &str| {
        h[format!("x-seen-{name}").as_str()]
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(seen("path"), "/echo/a%20b?x=1&y=%2F");
    assert_eq!(seen("authorization"), "none");
    assert_eq!(seen("x-custom"), "kept");
    assert_eq!(seen("host"), "localhost:8000");
    assert_eq!(
        seen("x-forwarded-prefix"),
        format!("/v1/sandboxes/{bare}/ports/8000")
    );

    // An upgrade is spliced: bytes both ways after the 101.
    let echoed = upgrade_echo(&d, &port_path(&bare, 8000, "/upgrade"), b"ping-pong").await;
    assert_eq!(echoed, b"ping-pong");

    // Nothing listens → 502 port_unreachable; bad ports → 400.
    let (status, h, body) = request(&d, "GET", &port_path(&bare, 8001, "/"), &[], "").await;
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    assert!(
        h.get("warren-port").is_none(),
        "Warren's own errors are not marked"
    );
    let e: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(e["error"]["code"], "port_unreachable", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("nothing listens on port 8001"));
    for bad in ["0", "65536", "http"] {
        let path = format!("/v1/sandboxes/{bare}/ports/{bad}/x");
        let (status, _, body) = request(&d, "GET", &path, &[], "").await;
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
    }
    let missing = crate::common::unknown_id(&d.node);
    let (status, _, _) = request(&d, "GET", &port_path(&missing, 8000, "/"), &[], "").await;
    assert_eq!(status, 404);

    // A paused sandbox is resumed by the request, as by any call.
    d.client().pause(&bare).await.unwrap();
    let (status, _, body) =
        request(&d, "GET", &port_path(&bare, 8000, "/hello.txt"), &[], "").await;
    assert_eq!((status, &body[..]), (200, &b"hello\n"[..]));
    assert_eq!(
        d.client().get(&bare).await.unwrap().state,
        SandboxState::Running
    );

    // With a network policy (a link, its own sysfs), the same: `python3 -m http.server`.
    let policy = serde_json::from_value(serde_json::json!({
        "mode": "allow", "allow": [{"cidr": "192.0.2.1/32", "ports": 80, "protocol": "tcp"}]
    }))
    .unwrap();
    let linked = d
        .create(&CreateSandboxRequest {
            network: policy,
            ..Default::default()
        })
        .await
        .id;
    serve(
        &d,
        &linked,
        "python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv",
        8080,
    )
    .await;
    let (status, _, body) =
        request(&d, "GET", &port_path(&linked, 8080, "/sub/f.txt"), &[], "").await;
    assert_eq!((status, &body[..]), (200, &b"deep\n"[..]));
    // Each sandbox's loopback is its own: the other one's server is not there.
    let (status, _, _) = request(&d, "GET", &port_path(&linked, 8000, "/"), &[], "").await;
    assert_eq!(status, 502);

    // Nothing stays behind: no daemon thread in a sandbox's namespace, no descriptor (counted
    // once both sandboxes exist: each holds descriptors of its own).
    let (_, fds_before) = daemon_threads_elsewhere_and_fds(pid);
    for _ in 0..20 {
        let (status, _, _) =
            request(&d, "GET", &port_path(&bare, 8000, "/hello.txt"), &[], "").await;
        assert_eq!(status, 200);
    }
    let settled = wait_for(Duration::from_secs(10), || async {
        let (elsewhere, fds) = daemon_threads_elsewhere_and_fds(pid);
        (elsewhere.is_empty() && fds <= fds_before).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "threads or descriptors left: {:?} (fds before: {fds_before})",
        daemon_threads_elsewhere_and_fds(pid)
    );
    for id in [&bare, &linked] {
        d.client().delete(id).await.unwrap();
    }
}

/// Sends an upgrade request to `path`, then `data` over the upgraded connection; answers
/// what came back.
async fn upgrade_echo(d: &Daemon, path: &str, data: &[u8]) -> Vec<u8> {
    let stream = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = hyper::Request::builder()
        .method("GET")
        .uri(path)
        .header("host", "localhost")
        .header("connection", "upgrade")
        .header("upgrade", "echo")
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 101);
    assert_eq!(resp.headers()["upgrade"], "echo");
    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    io.write_all(data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    tokio::time::timeout(Duration::from_secs(20), io.read_exact(&mut back))
        .await
        .expect("the echo within 20 s")
        .unwrap();
    back
}

/// One request over TCP with a token: `(status, body)`.
async fn with_token(port: u16, token: &str, path: &str) -> (u16, bytes::Bytes) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri(path)
        .header("host", "localhost")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_ports_are_not_found() {
    const A: &str = "ports-tenant-a-token-0123456789";
    const B: &str = "ports-tenant-b-token-0123456789";
    let Some((d, api)) =
        Daemon::start_with_tenants(&[("team-a", "user", A), ("team-b", "user", B)]).await
    else {
        return;
    };
    let a = warren_client::Client::builder()
        .url(format!("http://127.0.0.1:{api}"))
        .token(A)
        .request_timeout(Some(crate::common::CALL_TIMEOUT))
        .build()
        .unwrap();
    let id = a.create(&CreateSandboxRequest::default()).await.unwrap().id;
    d.sh_ok(&id, "mkdir -p /srv && echo mine > /srv/f").await;
    a.spawn(
        &id,
        &ExecRequest::shell("python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv"),
    )
    .await
    .unwrap();
    let path = port_path(&id, 8000, "/f");
    let up = wait_for(Duration::from_secs(30), || async {
        let (status, body) = with_token(api, A, &path).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(up.as_deref(), Some(&b"mine\n"[..]));
    let (status, body) = with_token(api, B, &path).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let e: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(e["error"]["code"], "not_found");
    a.delete(&id).await.unwrap();
}
