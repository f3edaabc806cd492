//! `warren bench tls`: what TLS and the token check cost on `exec true` over a kept-alive
//! connection, against plain HTTP on the same loopback port.
//!
//! It starts its own `warrend` (root; `WARREN_BIN_DIR` or next to this executable) on a
//! private state directory and a free loopback port, creates one sandbox, then alternates
//! rounds: the daemon restarted with `--tls-cert/--tls-key --auth` (a throw-away CA, server
//! certificate and token made here), and restarted plain without `--auth`, on the same port.
//! The sandbox survives each restart (re-adopted), so every round measures the same sandbox
//! through one client connection that stays open for the round. Reported: p50 of each mode
//! over all rounds and their difference (target ≤ 0.2 ms).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest};

use super::Check;
use crate::stats::Latency;
use crate::table::{ms, Table};

/// The token of the bench's only tenant.
const TOKEN: &str = "warren-bench-tls-token";
/// Calls before each round's samples (connection set up, caches warm).
const WARMUP: usize = 50;
/// Rounds per mode, alternated.
const ROUNDS: usize = 3;

#[derive(Debug, Serialize)]
pub struct TlsBench {
    pub plain: Latency,
    pub tls: Latency,
    /// `tls.p50_ms - plain.p50_ms`.
    pub overhead_p50_ms: f64,
    pub rounds: usize,
}

impl TlsBench {
    pub fn checks(&self) -> Vec<Check> {
        vec![Check::at_most(
            "exec p50 TLS + token - plain HTTP",
            self.overhead_p50_ms,
            "ms",
            0.2,
        )]
    }

    pub fn render(&self) -> String {
        let mut t = Table::new(["MODE", "N", "P50 ms", "P99 ms", "MEAN ms", "MIN ms"]);
        for (name, l) in [("plain HTTP", &self.plain), ("TLS + token", &self.tls)] {
            t.row([
                name.to_string(),
                l.n.to_string(),
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.mean_ms),
                ms(l.min_ms),
            ]);
        }
        format!(
            "exec true over one kept-alive connection, same port, {} rounds each\n{}\noverhead p50: {} ms\n",
            self.rounds,
            t.render(),
            ms(self.overhead_p50_ms)
        )
    }
}

pub(super) fn bin_dir() -> Result<PathBuf> {
    if let Ok(d) = std::env::var("WARREN_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    Ok(exe
        .parent()
        .context("executable has a directory")?
        .to_path_buf())
}

/// The throw-away CA's certificate, the server's certificate and key, and the auth file (an
/// admin tenant: the sandbox is made by root on the Unix socket and belongs to no tenant, and
/// the token check costs the same for every role).
fn write_pki(dir: &Path) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "warren bench CA");
    let ca = ca.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse()?)];
    let cert = p.signed_by(&key, &ca, &ca_key)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    std::fs::write(dir.join("server.pem"), cert.pem())?;
    std::fs::write(dir.join("server.key"), key.serialize_pem())?;
    let hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()))
    };
    std::fs::write(
        dir.join("auth.toml"),
        format!("[[tenant]]\nname = \"bench\"\nrole = \"admin\"\ntoken_sha256 = [\"{hash}\"]\n"),
    )?;
    Ok(())
}

struct Node {
    dir: PathBuf,
    node: String,
    port: u16,
    child: Option<Child>,
}

impl Node {
    fn socket(&self) -> PathBuf {
        self.dir.join("warrend.sock")
    }

    /// The root client on the Unix socket (setup and clean-up).
    fn admin(&self) -> Result<Client> {
        Ok(Client::builder()
            .url(format!("unix://{}", self.socket().display()))
            .build()?)
    }

    /// The measuring client: one connection, kept alive.
    fn client(&self, tls: bool) -> Result<Client> {
        let b = Client::builder().max_connections(1);
        Ok(if tls {
            b.url(format!("https://127.0.0.1:{}", self.port))
                .ca_file(self.dir.join("ca.pem"))
                .token(TOKEN)
                .build()?
        } else {
            b.url(format!("http://127.0.0.1:{}", self.port)).build()?
        })
    }

    async fn start(&mut self, tls: bool) -> Result<()> {
        let mut cmd = Command::new(bin_dir()?.join("warrend"));
        cmd.arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .args(["--node", &self.node])
            .args(["--listen", &format!("127.0.0.1:{}", self.port)]);
        if tls {
            cmd.arg("--tls-cert")
                .arg(self.dir.join("server.pem"))
                .arg("--tls-key")
                .arg(self.dir.join("server.key"))
                .arg("--auth")
                .arg(self.dir.join("auth.toml"));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("warrend.log"))?;
        self.child = Some(
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting warrend (set WARREN_BIN_DIR)")?,
        );
        let client = self.client(tls)?;
        let started = Instant::now();
        loop {
            if client.health().await.is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(s))) = self.child.as_mut().map(|c| c.try_wait()) {
                bail!(
                    "warrend exited ({s}); see {}",
                    self.dir.join("warrend.log").display()
                );
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("warrend did not answer in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        for _ in 0..200 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn round(client: &Client, id: &str, n: usize, out: &mut Vec<f64>) -> Result<()> {
    let req = ExecRequest {
        argv: Some(vec!["true".into()]),
        ..Default::default()
    };
    for i in 0..WARMUP + n {
        let t = Instant::now();
        let r = client.exec(id, &req).await.context("exec true")?;
        let dt = t.elapsed().as_secs_f64() * 1000.0;
        if !r.success() {
            bail!("exec true failed: {r:?}");
        }
        if i >= WARMUP {
            out.push(dt);
        }
    }
    Ok(())
}

pub async fn measure(n: usize) -> Result<TlsBench> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = std::env::temp_dir().join(format!("warren-bench-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    write_pki(&dir)?;
    let mut node = Node {
        node: format!("btls{}", std::process::id() % 100_000),
        dir: dir.clone(),
        port,
        child: None,
    };
    let result = async {
        node.start(false).await?;
        let id = node
            .admin()?
            .create(&CreateSandboxRequest::default())
            .await
            .context("creating the sandbox")?
            .id;
        let per_round = n.div_ceil(ROUNDS).max(1);
        let (mut plain, mut tls) = (Vec::new(), Vec::new());
        for r in 0..ROUNDS * 2 {
            let use_tls = r % 2 == 1;
            if r > 0 {
                node.stop();
                node.start(use_tls).await?;
            }
            let client = node.client(use_tls)?;
            let out = if use_tls { &mut tls } else { &mut plain };
            round(&client, &id, per_round, out).await?;
        }
        let _ = node.admin()?.delete(&id).await;
        let (plain, tls) = (Latency::from_samples(plain), Latency::from_samples(tls));
        Ok(TlsBench {
            overhead_p50_ms: tls.p50_ms - plain.p50_ms,
            plain,
            tls,
            rounds: ROUNDS,
        })
    }
    .await;
    if result.is_err() {
        if let Ok(c) = node.admin() {
            if let Ok(list) = c.list(&Default::default(), None).await {
                for s in list {
                    let _ = c.delete(&s.id).await;
                }
            }
        }
    }
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

pub async fn run(n: usize, json: bool, report_dir: Option<&std::path::Path>) -> Result<i32> {
    let b = measure(n).await?;
    let checks = b.checks();
    let v = serde_json::json!({"tls": b, "checks": checks});
    let mut text = b.render();
    for c in &checks {
        text.push_str(&format!(
            "{} {} = {:.3} {} (target {})\n",
            if c.pass { "PASS" } else { "FAIL" },
            c.metric,
            c.value,
            c.unit,
            c.target
        ));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{text}");
    }
    super::report::write_if(report_dir, || {
        super::report::Page::new("warren bench tls", text.clone(), &v)
    })?;
    Ok(if checks.iter().all(|c| c.pass) { 0 } else { 1 })
}
