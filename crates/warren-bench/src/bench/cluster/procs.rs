//! The processes of a cluster benchmark, all on loopback: a 3-member etcd, simulated nodes
//! (`warren-simnode`), gateways (`warren-gateway`) and, for the overhead measurement, a real
//! `warrend`. Every process is killed when its handle drops (`kill_on_drop`), and the etcd
//! data lives in a temporary directory removed with the [`Etcd`] handle, so an error or an
//! interrupt leaves nothing running and no key behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use warren_client::Client;

fn binary(name: &str) -> Result<PathBuf> {
    let p = super::super::daemon::bin_dir()?.join(name);
    if !p.exists() {
        bail!(
            "{} not found (build it with `cargo build --release --workspace --bins`, or set \
             WARREN_BIN_DIR)",
            p.display()
        );
    }
    Ok(p)
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough on a quiet host).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// One HTTP/1.1 request over a fresh loopback connection; returns status and body. For the
/// few calls to etcd's JSON gateway, which the Warren client does not speak.
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        anyhow::Ok(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .context("HTTP call timed out")??;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    // Chunked answers: keep the JSON between the chunk sizes.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.lines()
            .filter(|l| !l.chars().all(|c| c.is_ascii_hexdigit()))
            .collect::<Vec<_>>()
            .join("")
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// One etcd member.
struct Member {
    name: String,
    client_port: u16,
    child: Option<Child>,
}

/// A 3-member etcd cluster on loopback ports, its data in a temporary directory.
pub struct Etcd {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub async fn start() -> Result<Etcd> {
        let etcd = which("etcd")
            .context("etcd is not installed (scripts/setup.sh installs Debian's etcd-server)")?;
        let dir = tempfile::Builder::new()
            .prefix("warren-bench-etcd-")
            .tempdir()
            .context("making the etcd directory")?;
        let mut ports = Vec::new();
        for _ in 0..3 {
            ports.push((free_port()?, free_port()?));
        }
        let cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let token = format!("warren-bench-{}", std::process::id());
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let log = std::fs::File::create(dir.path().join(format!("{name}.log")))?;
            let child = Command::new(&etcd)
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.path().join(&name))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster={}", cluster.join(",")))
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .context("starting etcd")?;
            members.push(Member {
                name,
                client_port: *client,
                child: Some(child),
            });
        }
        let e = Etcd { members, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        for m in &e.members {
            loop {
                if let Ok((200, body)) = http(m.client_port, "GET", "/health", "").await {
                    if body.contains("true") {
                        break;
                    }
                }
                if Instant::now() > deadline {
                    bail!("etcd member {} not healthy within 30 s", m.name);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(e)
    }

    /// The client URLs, comma-separated.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the member that is the leader now.
    pub async fn leader(&self) -> Result<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let Ok((200, body)) = http(m.client_port, "POST", "/v3/maintenance/status", "{}").await
            else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(&body).context("etcd status")?;
            let me = v["header"]["member_id"].as_str().unwrap_or_default();
            if !me.is_empty() && v["leader"].as_str() == Some(me) {
                return Ok(self
                    .members
                    .iter()
                    .position(|x| x.name == m.name)
                    .unwrap_or(0));
            }
        }
        bail!("no etcd member says it leads")
    }

    /// `kill -9` of member `i`; returns its name.
    pub async fn kill(&mut self, i: usize) -> Result<String> {
        let m = &mut self.members[i];
        if let Some(mut c) = m.child.take() {
            c.kill().await.context("killing etcd")?;
        }
        Ok(m.name.clone())
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A `warren-simnode` process holding some simulated nodes.
pub struct SimNodes {
    child: Child,
    /// `(node id, url)` of each node.
    pub nodes: Vec<(String, String)>,
}

impl SimNodes {
    pub async fn start(
        etcd: &str,
        prefix: &str,
        first: usize,
        count: usize,
        create_ms: u64,
    ) -> Result<SimNodes> {
        let mut child = Command::new(binary("warren-simnode")?)
            .args(["--etcd", etcd, "--node-prefix", prefix])
            .args(["--first", &first.to_string(), "--nodes", &count.to_string()])
            .args(["--create-ms", &create_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting warren-simnode")?;
        let stdout = child.stdout.take().context("simnode stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut nodes = Vec::new();
        let read = async {
            while nodes.len() < count {
                let Some(line) = lines.next_line().await? else {
                    bail!("warren-simnode exited before its nodes were ready");
                };
                let mut parts = line.split_whitespace();
                if let (Some("ready"), Some(id), Some(url)) =
                    (parts.next(), parts.next(), parts.next())
                {
                    nodes.push((id.to_string(), url.to_string()));
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .context("simulated nodes not registered within 60 s")??;
        // Keep reading so the process never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(SimNodes { child, nodes })
    }

    /// `kill -9` of the whole process.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await.context("killing warren-simnode")
    }
}

/// A `warren-gateway` process.
pub struct Gateway {
    _child: Child,
    pub url: String,
    pub client: Client,
}

impl Gateway {
    pub async fn start(etcd: &str, log_dir: &Path, name: &str) -> Result<Gateway> {
        let port = free_port()?;
        let log = std::fs::File::create(log_dir.join(format!("{name}.log")))?;
        let mut child = Command::new(binary("warren-gateway")?)
            .args(["--etcd", etcd, "--listen", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting warren-gateway")?;
        let url = format!("http://127.0.0.1:{port}");
        let client = Client::builder().url(url.clone()).max_retries(0).build()?;
        for _ in 0..300 {
            if client.health().await.is_ok() {
                return Ok(Gateway {
                    _child: child,
                    url,
                    client,
                });
            }
            if let Ok(Some(s)) = child.try_wait() {
                bail!("warren-gateway exited ({s})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("warren-gateway did not answer within 15 s")
    }

    /// Waits until the gateway's view has `n` ready nodes.
    pub async fn wait_ready(&self, n: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(c) = self.client.cluster().await {
                let ready = c
                    .nodes
                    .iter()
                    .filter(|s| s.state == warren_types::NodeState::Ready)
                    .count();
                if ready >= n {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "gateway {} did not see {n} ready nodes in {limit:?}",
                    self.url
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A real `warrend` on a loopback port, registered in etcd (for the overhead measurement;
/// needs root and the default image).
pub struct RealNode {
    child: Option<Child>,
    pub url: String,
    dir: PathBuf,
}

impl RealNode {
    pub async fn start(etcd: &str, id: &str, dir: &Path) -> Result<RealNode> {
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        std::fs::create_dir_all(dir)?;
        let log = std::fs::File::create(dir.join("warrend.log"))?;
        let mut child = Command::new(binary("warrend")?)
            .args(["--node", id])
            .arg("--socket")
            .arg(dir.join("warrend.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--advertise", &url, "--etcd", etcd])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting warrend")?;
        let client = Client::builder().url(url.clone()).max_retries(0).build()?;
        for _ in 0..600 {
            if client.health().await.is_ok() {
                return Ok(RealNode {
                    child: Some(child),
                    url,
                    dir: dir.to_path_buf(),
                });
            }
            if let Ok(Some(s)) = child.try_wait() {
                bail!(
                    "warrend exited ({s}); see {}",
                    dir.join("warrend.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill().await;
        bail!("warrend did not answer within 30 s")
    }

    /// SIGTERM, then waits for the daemon to go (it leaves etcd and keeps nothing running
    /// once its sandboxes were deleted).
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = c.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            if tokio::time::timeout(Duration::from_secs(15), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}
