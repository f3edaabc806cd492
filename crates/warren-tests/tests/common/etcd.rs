//! A real etcd cluster for tests: `n` members of Debian's `etcd` on free loopback ports, with
//! their data in a private directory under the test root. Dropping it kills every member and
//! removes the directory.
//!
//! Without an `etcd` binary the tests print `SKIP` — except under `CI=true`, where a missing
//! etcd fails the test (scripts/setup.sh installs it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One member.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    pub dir: PathBuf,
    pub members: Vec<Member>,
    token: String,
}

/// A TCP port on 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port")
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

/// Why etcd tests cannot run here; panics instead under `CI=true`.
pub fn etcd_missing() -> Option<String> {
    let missing: Vec<&str> = ["etcd", "etcdctl"]
        .into_iter()
        .filter(|b| which(b).is_none())
        .collect();
    if missing.is_empty() {
        return None;
    }
    let why = format!(
        "{} not installed (Debian packages etcd-server, etcd-client; scripts/setup.sh installs them)",
        missing.join(" and ")
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and {why}: the cluster tests cannot run");
    }
    Some(why)
}

impl EtcdCluster {
    /// Starts `n` members under `root` and waits until the cluster answers; `None` (after
    /// printing `SKIP`) when etcd is missing outside CI.
    pub fn start(root: &Path, n: usize) -> Option<EtcdCluster> {
        if let Some(why) = etcd_missing() {
            println!("SKIP: {why}");
            return None;
        }
        let token = format!(
            "warren-test-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ (free_port() as u128)
        );
        let dir = root.join(format!("etcd-{}", free_port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the etcd directory");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let mut c = EtcdCluster {
            dir,
            members,
            token,
        };
        for i in 0..n {
            c.spawn(i, true);
        }
        c.wait_healthy(Duration::from_secs(30));
        Some(c)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize, new: bool) {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .expect("opening the etcd log");
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new("etcd")
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-token", &self.token])
            .args([
                "--initial-cluster-state",
                if new { "new" } else { "existing" },
            ])
            .args(["--logger", "zap", "--log-level", "warn"])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawning etcd");
        self.members[i].child = Some(child);
    }

    /// `http://127.0.0.1:p1,...` of every member.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn etcdctl(&self, endpoints: &str, args: &[&str]) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints, "--command-timeout=2s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs etcdctl against every live member; stdout when it succeeded.
    pub fn ctl(&self, args: &[&str]) -> Option<String> {
        self.etcdctl(&self.live_endpoints(), args)
    }

    fn live_endpoints(&self) -> String {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until a write goes through (the cluster has a leader and quorum).
    pub fn wait_healthy(&self, limit: Duration) {
        let started = Instant::now();
        loop {
            if self.ctl(&["put", "/warren-test/health", "1"]).is_some() {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "etcd did not become healthy within {limit:?}; logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the leader, asked of the live members.
    pub fn leader(&self) -> Option<usize> {
        let out = self.ctl(&["endpoint", "status", "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        for e in v.as_array()? {
            let st = &e["Status"];
            if st["header"]["member_id"] == st["leader"] {
                let ep = e["Endpoint"].as_str()?;
                return self
                    .members
                    .iter()
                    .position(|m| ep.ends_with(&format!(":{}", m.client_port)));
            }
        }
        None
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} runs");
        self.spawn(i, false);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("warren-tests: etcd files kept in {}", self.dir.display());
        }
    }
}
