//! A real cluster on this machine: a 3-member etcd, real `warrend`s registered in it (each
//! with its own node id, state directory, socket and TCP port) and real `warren-gateway`s.
//! Dropping it stops the gateways, deletes every sandbox and stops the nodes (which leave the
//! cluster), then stops etcd and removes its data.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warren_client::Client;
use warren_types::{ClusterInfo, NodeState};

use crate::common::{bin_dir, should_skip, test_root, Daemon, CALL_TIMEOUT};
use crate::etcd::{free_port, EtcdCluster};

/// A `warren-gateway` process.
pub struct GatewayProc {
    pub port: u16,
    pub log: PathBuf,
    pub etcd: String,
    /// Extra `warren-gateway` arguments, kept across restarts.
    pub extra_args: Vec<String>,
    child: Option<Child>,
    client: Client,
}

impl GatewayProc {
    pub async fn start(etcd: &str) -> GatewayProc {
        Self::start_with(etcd, Vec::new(), None).await
    }

    /// Like [`GatewayProc::start`], with extra arguments (`--auth FILE`, ...) and the token
    /// its client (and the start-up health check) uses.
    pub async fn start_with(
        etcd: &str,
        extra_args: Vec<String>,
        token: Option<&str>,
    ) -> GatewayProc {
        let port = free_port();
        let log = test_root().join(format!("gateway-{port}.log"));
        let mut g = GatewayProc {
            port,
            log,
            etcd: etcd.to_string(),
            extra_args,
            child: None,
            client: client_for(port, token),
        };
        g.spawn().await;
        g
    }

    pub async fn spawn(&mut self) {
        std::fs::create_dir_all(test_root()).unwrap();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening the gateway log");
        let child = Command::new(bin_dir().join("warren-gateway"))
            .args(["--etcd", &self.etcd])
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--name", &format!("gw{}", self.port)])
            .args(&self.extra_args)
            // Requests are logged at debug level (with their request ids).
            .env("RUST_LOG", "info,warren_cluster=debug,warren_gateway=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawning warren-gateway");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(Ok(h)) =
                tokio::time::timeout(Duration::from_secs(2), self.client.health()).await
            {
                assert!(h.is_ok());
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "warren-gateway did not answer on port {}; log:\n{}",
                self.port,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `GET /v1/cluster`.
    pub async fn cluster(&self) -> ClusterInfo {
        let (status, body) = http(self.port, "GET", "/v1/cluster", "").await;
        assert_eq!(status, 200, "GET /v1/cluster: {body}");
        serde_json::from_str(&body).expect("a ClusterInfo")
    }

    /// The state of node `id` in this gateway's view.
    pub async fn node_state(&self, id: &str) -> Option<NodeState> {
        self.cluster()
            .await
            .nodes
            .into_iter()
            .find(|n| n.id.as_str() == id)
            .map(|n| n.state)
    }
}

impl GatewayProc {
    /// Sends SIGTERM and waits up to `within` for the gateway to exit; true if it did.
    pub fn stop_within(&mut self, within: Duration) -> bool {
        let Some(c) = self.child.as_mut() else {
            return true;
        };
        let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(_)) = c.try_wait() {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!("warren-tests: gateway log kept in {}", self.log.display());
        }
    }
}

fn client_for(port: u16, token: Option<&str>) -> Client {
    let b = Client::builder().url(format!("http://127.0.0.1:{port}"));
    let b = match token {
        Some(t) => b.token(t),
        None => b,
    };
    b.max_connections(64)
        .request_timeout(Some(CALL_TIMEOUT))
        .build()
        .expect("building the client")
}

/// One HTTP/1.1 exchange with 127.0.0.1:`port`: `(status, body)`.
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    http_full(port, method, path, body)
        .await
        .map(|(s, _, b)| (s, b))
        .unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}"))
}

/// Like [`http`], with the response headers; an error when the connection fails.
pub async fn http_full(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, hyper::HeaderMap, String), String> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(CALL_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    conn.abort();
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// A cluster: gateways first (dropped first), then nodes, then etcd.
pub struct Cluster {
    pub gateways: Vec<GatewayProc>,
    pub nodes: Vec<Daemon>,
    pub node_ports: Vec<u16>,
    pub etcd: EtcdCluster,
}

/// Why the cluster tests cannot run here (after the common rule: root, daemon binaries).
fn skip() -> bool {
    if should_skip() {
        return true;
    }
    let gw = bin_dir().join("warren-gateway");
    if !gw.is_file() {
        crate::common::skip(format!(
            "{} is missing; build it with `cargo build --release --workspace --bins`",
            gw.display()
        ));
        return true;
    }
    false
}

impl Cluster {
    /// `nodes` nodes (each with `node_args(i)` on top of the cluster flags) and `gateways`
    /// gateways over a 3-member etcd; waits until every gateway sees every node ready.
    pub async fn start(
        nodes: usize,
        gateways: usize,
        node_args: impl Fn(usize) -> Vec<String>,
    ) -> Option<Cluster> {
        if skip() {
            return None;
        }
        std::fs::create_dir_all(test_root()).unwrap();
        let etcd = EtcdCluster::start(&test_root(), 3)?;
        let endpoints = etcd.endpoints();
        let mut ds = Vec::new();
        let mut ports = Vec::new();
        for i in 0..nodes {
            let port = free_port();
            let extra = node_args(i);
            let ep = endpoints.clone();
            let d = Daemon::start_with(move |_| {
                let mut a = vec![
                    "--listen".to_string(),
                    format!("127.0.0.1:{port}"),
                    "--etcd".to_string(),
                    ep,
                ];
                a.extend(extra);
                a
            })
            .await?;
            ds.push(d);
            ports.push(port);
        }
        let mut gws = Vec::new();
        for _ in 0..gateways {
            gws.push(GatewayProc::start(&endpoints).await);
        }
        let c = Cluster {
            gateways: gws,
            nodes: ds,
            node_ports: ports,
            etcd,
        };
        c.wait_all(NodeState::Ready, Duration::from_secs(20)).await;
        Some(c)
    }

    pub fn gw(&self, i: usize) -> &Client {
        self.gateways[i].client()
    }

    /// Index of the node that owns sandbox `id`.
    pub fn owner(&self, id: &str) -> usize {
        let node = id.split_once('-').expect("a sandbox id").0;
        self.nodes
            .iter()
            .position(|d| d.node == node)
            .unwrap_or_else(|| panic!("sandbox {id} of an unknown node"))
    }

    /// Waits until every gateway shows every node in `state`.
    pub async fn wait_all(&self, state: NodeState, limit: Duration) {
        for (i, d) in self.nodes.iter().enumerate() {
            self.wait_node(i, state, limit).await;
            let _ = d;
        }
    }

    /// Waits until every gateway shows node `i` in `state`; the time it took.
    pub async fn wait_node(&self, i: usize, state: NodeState, limit: Duration) -> Duration {
        let started = Instant::now();
        let id = self.nodes[i].node.clone();
        for g in &self.gateways {
            loop {
                if g.node_state(&id).await == Some(state) {
                    break;
                }
                assert!(
                    started.elapsed() < limit,
                    "gateway {} did not show node {id} {state:?} within {limit:?}: {:?}\ngateway log:\n{}\nnode log:\n{}",
                    g.port,
                    g.node_state(&id).await,
                    g.log_tail(),
                    self.nodes[i].log_tail(30)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        started.elapsed()
    }

    /// Sandbox ids by owning node index.
    pub fn by_node(&self, ids: &[String]) -> BTreeMap<usize, Vec<String>> {
        let mut m: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for id in ids {
            m.entry(self.owner(id)).or_default().push(id.clone());
        }
        m
    }
}
