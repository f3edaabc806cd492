//! A private `warrend` of one benchmark: where the binaries are, the start (its socket and
//! state in a directory of the benchmark's, its output in `warrend.log` there, answered once
//! `health` answers), a SIGKILL, and a stop (SIGTERM, then SIGKILL if it does not exit in
//! time). The benchmark adds its own flags and keeps the directory; a daemon is stopped when
//! its handle drops, so an error leaves no `warrend` running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use warren_client::Client;

/// Where the Warren binaries are: `$WARREN_BIN_DIR`, else next to this executable.
pub fn bin_dir() -> Result<PathBuf> {
    if let Ok(d) = std::env::var("WARREN_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    Ok(exe
        .parent()
        .context("the executable has a directory")?
        .to_path_buf())
}

/// How long a stopping daemon gets after SIGTERM before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// One `warrend` in `dir` (started or not).
pub struct Daemon {
    dir: PathBuf,
    node: String,
    child: Option<Child>,
}

impl Daemon {
    /// A daemon named `node` whose socket, state and log are in `dir` (made if missing).
    pub fn new(dir: &Path, node: &str) -> Result<Daemon> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Daemon {
            dir: dir.to_path_buf(),
            node: node.to_string(),
            child: None,
        })
    }

    /// The running daemon's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The daemon's Unix socket (the root client's way in).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("warrend.sock")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("warrend.log")
    }

    /// A client on the Unix socket with at most `connections` connections.
    pub fn client(&self, connections: usize) -> Result<Client> {
        Ok(Client::builder()
            .url(format!("unix://{}", self.socket().display()))
            .max_connections(connections)
            .build()?)
    }

    /// Starts the daemon with the flags `flags` adds to its socket, state directory and node
    /// name, and waits until `probe` (a client of the daemon's, on the socket or a listener
    /// the flags open) gets an answer to `health`, at most `within`.
    pub async fn start(
        &mut self,
        flags: impl FnOnce(&mut Command),
        probe: &Client,
        within: Duration,
    ) -> Result<()> {
        if self.child.is_some() {
            bail!("warrend of {} is running already", self.dir.display());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())?;
        let mut cmd = Command::new(bin_dir()?.join("warrend"));
        cmd.arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .args(["--node", &self.node]);
        flags(&mut cmd);
        self.child = Some(
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting warrend (set WARREN_BIN_DIR)")?,
        );
        let started = Instant::now();
        loop {
            if probe.health().await.is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(s))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                bail!("warrend exited ({s}); see {}", self.log().display());
            }
            if started.elapsed() > within {
                self.stop();
                bail!(
                    "warrend did not answer in {} s; see {}",
                    within.as_secs(),
                    self.log().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the daemon with SIGKILL (a crash) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the daemon with SIGTERM and waits for it (its sandboxes stay, as after any
    /// stop); SIGKILL if it is not gone within 30 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let t = Instant::now();
        while t.elapsed() < STOP_WITHIN {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
