//! Placement, routing, listing, idempotency, drain and admission through two gateways.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use warren_client::{CreateSandboxRequest, ExecRequest, PtyEvent};
use warren_types::{ErrorCode, ExecEvent, NodeState};

use crate::harness::{http, http_full, Cluster};

fn labelled(run: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        labels: [("run".to_string(), run.to_string())].into(),
        memory_mb: Some(64),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_routing_listing_drain_and_admission() {
    // Each node admits 8 sandboxes at most: the last part fills the cluster.
    let Some(c) = Cluster::start(3, 2, |_| vec!["--max-running".into(), "8".into()]).await else {
        return;
    };
    let (g0, g1) = (c.gw(0), c.gw(1));
    let h = g0.health().await.unwrap();
    assert!(h.is_ok());
    assert_eq!(h.extra["gateway"]["nodes_ready"], 3, "{h:?}");
    import_through_a_gateway_reaches_every_node(&c).await;
    run_code_through_a_gateway(&c).await;

    // Placement spreads sandboxes over the nodes.
    let run = format!("r{}", std::process::id());
    let mut ids = Vec::new();
    for i in 0..12 {
        let g = if i % 2 == 0 { g0 } else { g1 };
        let sb = g
            .create(&labelled(&run))
            .await
            .expect("create through a gateway");
        ids.push(sb.id);
    }
    let spread = c.by_node(&ids);
    assert_eq!(spread.len(), 3, "12 creates reached only nodes {spread:?}");

    // Exec, streamed exec, files and a terminal through a gateway, on every node.
    for sandboxes in spread.values() {
        let id = &sandboxes[0];
        let r = g1
            .exec(id, &ExecRequest::shell("echo $((6*7))"))
            .await
            .unwrap();
        assert_eq!(r.stdout, "42\n");
        let mut s = g0
            .exec_stream(id, &ExecRequest::shell("echo a; sleep 0.2; echo b"))
            .await
            .unwrap();
        let mut out = String::new();
        let mut code = None;
        while let Some(ev) = s.next().await {
            match ev.unwrap() {
                ExecEvent::Stdout { data } => out.push_str(&data),
                ExecEvent::Exit { result } => code = result.exit_code,
                _ => {}
            }
        }
        assert_eq!((out.as_str(), code), ("a\nb\n", Some(0)));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        g0.write_file_bytes(id, "/tmp/blob", None, data.clone())
            .await
            .unwrap();
        let back = g1.read_file_bytes(id, "/tmp/blob").await.unwrap();
        assert_eq!(back.as_ref(), &data[..], "a file through two gateways");
        let mut pty = g1.pty(id, "/bin/sh", 80, 24).await.expect("a terminal");
        pty.send(&b"echo via-gw; exit 5\n"[..]).await.unwrap();
        let mut term = Vec::new();
        let exit = loop {
            match tokio::time::timeout(Duration::from_secs(20), pty.next_event())
                .await
                .expect("terminal output in time")
                .unwrap()
            {
                Some(PtyEvent::Output(b)) => term.extend_from_slice(&b),
                Some(PtyEvent::Exit { exit_code, .. }) => break exit_code,
                None => panic!("terminal closed: {:?}", String::from_utf8_lossy(&term)),
            }
        };
        assert_eq!(exit, Some(5));
        assert!(String::from_utf8_lossy(&term).contains("via-gw"));
    }

    ports_through_gateways(g0, g1, &spread.values().next().unwrap()[0]).await;

    // The label listing merges every node's sandboxes, in creation order, paginated.
    let labels: BTreeMap<String, String> = [("run".to_string(), run.clone())].into();
    let listed: Vec<String> = g1
        .list(&labels, None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, ids, "the merged list is in creation order");
    let mut paged = Vec::new();
    let mut after = String::new();
    loop {
        let q = format!("/v1/sandboxes?label=run%3D{run}&limit=5{after}");
        let (status, body) = http(c.gateways[0].port, "GET", &q, "").await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let page: Vec<String> = v["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect();
        assert!(page.len() <= 5);
        paged.extend(page);
        match v["next_after"].as_str() {
            Some(n) => after = format!("&after={n}"),
            None => break,
        }
    }
    assert_eq!(paged, ids, "pages of 5 give the same list");

    // One idempotency key through two gateways: one sandbox.
    let mut req = labelled(&format!("{run}-key"));
    req.idempotency_key = Some(format!("key-{run}"));
    let a = g0.create(&req).await.unwrap();
    let b = g1.create(&req).await.unwrap();
    assert_eq!(a.id, b.id);
    let key_labels: BTreeMap<String, String> = [("run".to_string(), format!("{run}-key"))].into();
    assert_eq!(g0.list(&key_labels, None).await.unwrap().len(), 1);

    // Nothing can ever fit: 422 saying why.
    let (status, body) = http(
        c.gateways[0].port,
        "POST",
        "/v1/sandboxes",
        r#"{"image":"no-such-image:1"}"#,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("unschedulable") && body.contains("3 nodes lack image"),
        "{body}"
    );
    // A malformed id is refused by the gateway; an unknown node is not found.
    let (status, _) = http(c.gateways[1].port, "GET", "/v1/sandboxes/bad-id", "").await;
    assert_eq!(status, 400);
    let (status, _) = http(
        c.gateways[1].port,
        "GET",
        "/v1/sandboxes/zz9-01jd0m7x4e8k0k9yq1w2e3r4t5",
        "",
    )
    .await;
    assert_eq!(status, 404);

    // Drain: every gateway sees it; new sandboxes avoid the node; undrain.
    let drained = c.nodes[0].node.clone();
    let (status, body) = http(
        c.gateways[0].port,
        "POST",
        &format!("/v1/cluster/nodes/{drained}/drain"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    c.wait_node(0, NodeState::Draining, Duration::from_secs(10))
        .await;
    let mut after_drain = Vec::new();
    for _ in 0..4 {
        after_drain.push(g1.create(&labelled(&run)).await.unwrap().id);
    }
    assert!(
        after_drain.iter().all(|id| c.owner(id) != 0),
        "a drained node got a sandbox: {after_drain:?}"
    );
    // Its sandboxes are still served.
    let on_drained = &spread[&0][0];
    assert!(g1
        .exec(on_drained, &ExecRequest::shell("true"))
        .await
        .unwrap()
        .success());
    let (status, _) = http(
        c.gateways[1].port,
        "POST",
        &format!("/v1/cluster/nodes/{drained}/undrain"),
        "",
    )
    .await;
    assert_eq!(status, 200);
    c.wait_node(0, NodeState::Ready, Duration::from_secs(10))
        .await;

    // The gateway's cost on `exec true`, measured against the node directly.
    let owner = c.owner(&ids[0]);
    let r = warren_gateway::bench::exec_overhead(
        &format!("http://127.0.0.1:{}", c.node_ports[owner]),
        &c.gateways[0].url(),
        &ids[0],
        200,
    )
    .await
    .expect("measuring the gateway overhead");
    println!(
        "gateway overhead on exec true: {}",
        serde_json::to_string(&r).unwrap()
    );

    // Admission: the nodes admit 8 each (24); 17 exist. Fill the cluster: the nodes refuse
    // (429), the gateway tries the others, then answers 503 capacity_unavailable.
    let mut refused = None;
    for _ in 0..12 {
        let res = http_full(
            c.gateways[0].port,
            "POST",
            "/v1/sandboxes",
            &serde_json::json!({"memory_mb": 64, "labels": {"run": run}}).to_string(),
        )
        .await
        .unwrap();
        if res.0 == 503 {
            refused = Some(res);
            break;
        }
        assert_eq!(res.0, 201, "{}", res.2);
    }
    let (_, headers, body) = refused.expect("a full cluster refuses creates");
    assert!(
        body.contains(ErrorCode::CapacityUnavailable.as_str()),
        "{body}"
    );
    assert!(headers.get("retry-after").is_some(), "{headers:?}");
    let all: BTreeSet<String> = g0
        .list(&labels, None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        all.len(),
        24 - 1,
        "every node holds 8 (one of them the keyed sandbox)"
    );
}

/// `POST /run_code` (SandboxFusion's protocol) is placed like a function call and answered
/// by the node that ran it; a request that does not validate is refused in the protocol's
/// shape by the gateway itself (`/run_jupyter`: `fusion.rs`).
async fn run_code_through_a_gateway(c: &Cluster) {
    let port = c.gateways[0].port;
    let (status, body) = http(
        port,
        "POST",
        "/run_code",
        r#"{"code": "print(int(input()) * 6)", "language": "python", "stdin": "7"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "Success", "{v}");
    assert_eq!(v["run_result"]["stdout"], "42\n", "{v}");
    let node = v["executor_pod_name"].as_str().unwrap().to_string();
    assert!(
        c.nodes.iter().any(|d| d.node == node),
        "ran on {node}, not a node of the cluster"
    );
    let (status, body) = http(port, "POST", "/run_code", r#"{"language": "python"}"#).await;
    assert_eq!(status, 422, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["detail"][0]["loc"][0], "body", "{v}");
    // A function call whose files are over 2 MiB is placed as a node takes it.
    let call = serde_json::json!({
        "argv": ["wc", "-c", "/tmp/big"],
        "files": [{"path": "/tmp/big", "content": "x".repeat(3 << 20)}],
    });
    let (status, body) = http(port, "POST", "/v1/functions/call", &call.to_string()).await;
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["stdout"], format!("{} /tmp/big\n", 3 << 20), "{v}");
}

/// `warren image import` through a gateway: the archive is sent once and every node has the
/// image; a sandbox on it can be created through either gateway; removed, it is gone from all.
async fn import_through_a_gateway_reaches_every_node(c: &Cluster) {
    let t = crate::layers::scratch("gateway-import");
    let tag = format!("gwimport{}:1", std::process::id());
    let l = crate::layers::tar_entries(&[("srv/", ""), ("srv/hello", "one archive, every node")]);
    let archive = t.path().join("app.tar");
    crate::layers::docker_archive(&[l], "x:1", &archive);
    let out = crate::common::warren_at(
        &c.gateways[0].url(),
        &[
            "image",
            "import",
            archive.to_str().unwrap(),
            "--tag",
            &tag,
            "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    for port in &c.node_ports {
        let (status, body) = http(*port, "GET", &format!("/v1/images/{tag}"), "").await;
        assert_eq!(status, 200, "node on port {port}: {body}");
    }
    let req = CreateSandboxRequest {
        image: warren_client::ImageRef::Stack(vec!["default".into(), tag.clone()]),
        memory_mb: Some(64),
        ..Default::default()
    };
    let sb = c
        .gw(1)
        .create(&req)
        .await
        .expect("a sandbox on the imported image");
    let r = c
        .gw(0)
        .exec(&sb.id, &ExecRequest::shell("cat /srv/hello"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "one archive, every node");
    c.gw(0).delete(&sb.id).await.unwrap();
    c.gw(1).delete_image(&tag).await.unwrap();
    for port in &c.node_ports {
        let (status, body) = http(*port, "GET", &format!("/v1/images/{tag}"), "").await;
        assert_eq!(status, 404, "node on port {port}: {body}");
    }
}

/// `/v1/sandboxes/{id}/ports/{port}/...` through a gateway: the wildcard path and query reach
/// the node, bodies larger than the gateway reads whole stream both ways, and the node's 502
/// for a port nothing listens on comes back as it is.
async fn ports_through_gateways(g0: &warren_client::Client, g1: &warren_client::Client, id: &str) {
    use hyper::{HeaderMap, Method};
    let server = r#"mkdir -p /srv/a && echo deep > /srv/a/f.txt && cat > /tmp/echo.py <<'EOF'
import http.server
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Seen-Path", self.path)
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), lambda *a: H(*a, directory="/srv")).serve_forever()
EOF"#;
    g0.exec(id, &ExecRequest::shell(server)).await.unwrap();
    g0.spawn(id, &ExecRequest::shell("python3 /tmp/echo.py"))
        .await
        .unwrap();
    let none = HeaderMap::new();
    let mut up = None;
    for _ in 0..300 {
        match g1
            .port_request(
                id,
                8000,
                Method::GET,
                "/a/f.txt",
                &none,
                bytes::Bytes::new(),
            )
            .await
        {
            Ok(a) => {
                up = Some(a);
                break;
            }
            Err(e) if e.code() == Some(ErrorCode::PortUnreachable) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("GET through a gateway: {e}"),
        }
    }
    let got = up.expect("the server listened within 30 s");
    assert_eq!(got.status, 200);
    assert_eq!(&got.body.collect_bytes().await.unwrap()[..], b"deep\n");
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let put = g0
        .port_request(id, 8000, Method::PUT, "/x/y?z=1", &none, big.clone().into())
        .await
        .unwrap();
    assert_eq!(put.status, 200);
    assert_eq!(put.headers["x-seen-path"], "/x/y?z=1");
    assert_eq!(&put.body.collect_bytes().await.unwrap()[..], &big[..]);
    let e = g1
        .port_request(id, 8001, Method::GET, "/", &none, bytes::Bytes::new())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PortUnreachable), "{e}");
}
