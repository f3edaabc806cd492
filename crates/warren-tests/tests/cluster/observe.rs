//! Watching a cluster: a request id given to the gateway reaches the node (its answer, its
//! error body, both logs), and the gateway's dashboard shows the nodes and their sandboxes in
//! a real browser.

use std::time::Duration;

use warren_client::CreateSandboxRequest;

use crate::browser::{assert_clean, chromium, count, load, text_of};
use crate::common::{repo_root, test_root, unknown_id, wait_for};
use crate::harness::Cluster;

/// One exchange with the gateway at `port` with extra headers: `(status, headers, body)`.
/// Sends one GET to the gateway at `port` with extra headers; the response's body is read by
/// the caller while the connection task runs.
async fn send_get(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> (
    hyper::Response<hyper::body::Incoming>,
    tokio::task::JoinHandle<()>,
) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = hyper::Request::get(path).header(hyper::header::HOST, "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(
            req.body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    (resp, conn)
}

async fn get_with(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::BodyExt;
    let (resp, conn) = send_get(port, path, headers).await;
    let (status, h) = (resp.status().as_u16(), resp.headers().clone());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    conn.abort();
    (status, h, String::from_utf8_lossy(&body).into_owned())
}

async fn log_with(path: &std::path::Path, needle: &str) -> bool {
    wait_for(Duration::from_secs(10), || async {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .contains(needle)
            .then_some(())
    })
    .await
    .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_goes_from_the_gateway_to_the_node_and_the_dashboard_shows_the_cluster() {
    let Some(c) = Cluster::start(1, 1, |_| vec!["--log-format".into(), "json".into()]).await else {
        return;
    };
    let (gw, node) = (&c.gateways[0], &c.nodes[0]);
    let path = format!("/v1/sandboxes/{}", unknown_id(&node.node));

    // The caller's id: the node answers with it, through the gateway.
    let (status, h, body) = get_with(gw.port, &path, &[("x-request-id", "via-gateway-1")]).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(h["x-request-id"], "via-gateway-1");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["request_id"], "via-gateway-1", "{body}");
    assert!(
        log_with(&node.log, "\"request_id\":\"via-gateway-1\"").await,
        "the node logs the gateway's id:\n{}",
        node.log_tail(20)
    );
    assert!(
        log_with(&gw.log, "request_id=via-gateway-1").await,
        "the gateway logs it:\n{}",
        gw.log_tail()
    );
    // None given: the gateway makes one and the node keeps it.
    let (_, h, body) = get_with(gw.port, &path, &[]).await;
    let made = h["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(made.len(), 26, "{made}");
    assert!(
        body.contains(&format!("\"request_id\":\"{made}\"")),
        "{body}"
    );
    assert!(log_with(&node.log, &made).await, "{}", node.log_tail(20));

    // The dashboard, served by the gateway over the cluster.
    let browser = match chromium() {
        Ok(b) => b,
        Err(why) => return crate::common::skip(why),
    };
    let client = c.gw(0);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let req = CreateSandboxRequest {
            memory_mb: Some(64),
            ..Default::default()
        };
        ids.push(client.create(&req).await.unwrap().id);
    }
    // The gateway's view follows the nodes' published load.
    wait_for(Duration::from_secs(20), || async {
        let info = gw.cluster().await;
        (info
            .nodes
            .iter()
            .map(|n| n.record.load.sandboxes())
            .sum::<u64>()
            == 2)
            .then_some(())
    })
    .await
    .expect("the gateway sees both sandboxes");
    let shots = repo_root().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let profile = test_root().join(format!("gw{}-chromium", gw.port));
    let base = format!("http://127.0.0.1:{}/ui", gw.port);
    let l = load(
        &browser,
        &profile,
        &format!("{base}#/"),
        &shots.join("gateway-overview.png"),
    );
    assert_clean("overview", &l);
    assert_eq!(
        text_of(&l.dom, "id=\"count-sandboxes\""),
        Some("2"),
        "{}",
        l.dom
    );
    assert!(l.dom.contains(&format!("data-node=\"{}\"", node.node)));
    assert!(l.dom.contains("Cluster "), "the page knows it is a gateway");
    let l = load(
        &browser,
        &profile,
        &format!("{base}#/sandboxes"),
        &shots.join("gateway-sandboxes.png"),
    );
    assert_clean("sandboxes", &l);
    assert_eq!(count(&l.dom, "<tr data-id="), 2);
    assert!(
        l.dom.contains("data-live=\"sse\""),
        "the merged stream: {}",
        l.dom
    );
    let l = load(
        &browser,
        &profile,
        &format!("{base}#/sandbox/{}", ids[0]),
        &shots.join("gateway-sandbox.png"),
    );
    assert_clean("sandbox", &l);
    assert!(text_of(&l.dom, "id=\"stat-memory\"")
        .unwrap()
        .contains("/ 64.0 MiB"));
    for id in ids {
        client.delete(&id).await.unwrap();
    }
    let _ = std::fs::remove_dir_all(&profile);
}

/// The events of `GET /v1/events` on `port`, read as they come: `(name, data)`.
struct EventStream {
    body: hyper::body::Incoming,
    buf: String,
    _conn: tokio::task::JoinHandle<()>,
}

impl EventStream {
    async fn open(port: u16, path: &str) -> EventStream {
        let (resp, conn) = send_get(port, path, &[]).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        EventStream {
            body: resp.into_body(),
            buf: String::new(),
            _conn: conn,
        }
    }

    /// The next event for which `want(name, data)` holds, within 20 s.
    async fn until(
        &mut self,
        what: &str,
        want: impl Fn(&str, &serde_json::Value) -> bool,
    ) -> serde_json::Value {
        use http_body_util::BodyExt;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let (mut name, mut data) = ("", String::new());
                for line in event.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = n;
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) {
                    if want(name, &v) {
                        return v;
                    }
                }
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .unwrap_or_else(|_| panic!("no {what} within 20 s"))
                .expect("the event stream ended")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_merges_the_event_streams_of_every_node() {
    let Some(mut c) = Cluster::start(2, 1, |_| Vec::new()).await else {
        return;
    };
    let gw = &c.gateways[0];
    let mut events = EventStream::open(gw.port, "/v1/events?interval_ms=250").await;
    for node in &c.nodes {
        let n = node.node.clone();
        events
            .until(&format!("a load event of {n}"), |name, v| {
                name == "load" && v["node"] == n.as_str()
            })
            .await;
    }
    let client = c.gw(0);
    let id = client
        .create(&CreateSandboxRequest {
            memory_mb: Some(64),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let seen = events
        .until("the new sandbox", |name, v| {
            name == "sandbox" && v["id"] == id.as_str()
        })
        .await;
    assert_eq!(seen["state"], "running");
    client.delete(&id).await.unwrap();
    events
        .until("its deletion", |name, v| {
            name == "deleted" && v["id"] == id.as_str()
        })
        .await;
    // A refused parameter is the node's refusal, passed on.
    let (status, _, body) = get_with(gw.port, "/v1/events?interval_ms=1", &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("interval_ms"), "{body}");

    // The gateway's own metrics: the placement, requests by route, nodes by state, refusals
    // by reason (every reason listed), all of them documented.
    let (status, _, text) = get_with(gw.port, "/metrics", &[]).await;
    assert_eq!(status, 200, "{text}");
    for line in [
        "warren_gateway_placements_total 1\n",
        "warren_http_requests_total{method=\"POST\",route=\"/v1/sandboxes\",status=\"201\"} 1\n",
        "warren_http_requests_total{method=\"DELETE\",route=\"/v1/sandboxes/{id}\",status=\"204\"} 1\n",
        "warren_gateway_nodes{state=\"ready\"} 2\n",
        "warren_gateway_refusals_total{reason=\"node_busy\"} 0\n",
        "warren_build_info{version=\"",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    let doc = std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap();
    let undocumented = warren_edge::http_metrics::undocumented(&text, &doc);
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );

    // An open event stream never ends on its own: it does not keep the gateway from stopping.
    let mut open = EventStream::open(gw.port, "/v1/events").await;
    open.until("a load event", |name, _| name == "load").await;
    let gw = &mut c.gateways[0];
    assert!(
        gw.stop_within(Duration::from_secs(15)),
        "the gateway did not stop with an event stream open:\n{}",
        gw.log_tail()
    );
}
