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

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest};

use super::daemon::Daemon;
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

/// The measured daemon: plain HTTP or TLS with a token on the same loopback port.
struct Node {
    daemon: Daemon,
    port: u16,
}

impl Node {
    /// The root client on the Unix socket (setup and clean-up).
    fn admin(&self) -> Result<Client> {
        self.daemon.client(warren_client::DEFAULT_MAX_CONNECTIONS)
    }

    /// The measuring client: one connection, kept alive.
    fn client(&self, tls: bool) -> Result<Client> {
        let b = Client::builder().max_connections(1);
        Ok(if tls {
            b.url(format!("https://127.0.0.1:{}", self.port))
                .ca_file(self.daemon.dir().join("ca.pem"))
                .token(TOKEN)
                .build()?
        } else {
            b.url(format!("http://127.0.0.1:{}", self.port)).build()?
        })
    }

    async fn start(&mut self, tls: bool) -> Result<()> {
        let (dir, port) = (self.daemon.dir().to_path_buf(), self.port);
        let probe = self.client(tls)?;
        let flags = |cmd: &mut std::process::Command| {
            cmd.args(["--listen", &format!("127.0.0.1:{port}")]);
            if tls {
                cmd.arg("--tls-cert")
                    .arg(dir.join("server.pem"))
                    .arg("--tls-key")
                    .arg(dir.join("server.key"))
                    .arg("--auth")
                    .arg(dir.join("auth.toml"));
            }
        };
        self.daemon
            .start(flags, &probe, Duration::from_secs(30))
            .await
    }

    fn stop(&mut self) {
        self.daemon.stop();
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
        daemon: Daemon::new(&dir, &format!("btls{}", std::process::id() % 100_000))?,
        port,
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
    super::answer("tls", &b, b.render(), &b.checks(), 3, json, report_dir)
}
