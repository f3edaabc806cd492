//! Shared helpers of the integration tests: a private `warrend` per test, the skip rule, the
//! run registry the leak check reads, and small sandbox utilities.
//!
//! Every test binary includes this module; not every binary uses every helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warren_client::{Client, CreateSandboxRequest, ExecRequest, ExecResult, SandboxInfo};

/// How long a fresh daemon may take to answer `/v1/health`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit after SIGTERM (it drains for up to 5 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest any API call of the tests may take until its answer starts.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// Shell snippet that prints one line per process visible in the sandbox: `PID CMDLINE`.
/// The default image has no `ps`, so it reads `/proc` directly.
pub const PS: &str = r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null); echo "${p#/proc/} $c"; done"#;

/// The directory that holds every test daemon's socket, state and log
/// (`$WARREN_TEST_DIR`, default `/tmp/warren-tests`).
pub fn test_root() -> PathBuf {
    match std::env::var_os("WARREN_TEST_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/tmp/warren-tests"),
    }
}

/// A VM working directory the test daemons that opt in share (`--vm-dir`): their VM
/// templates are made once per machine shape for the whole run. It stays between runs, like
/// the VM runtime tests' image cache (`vm-runtime/`), and each daemon removes its own
/// sandboxes' files from it.
pub fn shared_vm_dir() -> PathBuf {
    test_root().join("vm-shared")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

/// Where `warrend`, `warren-agent` and `warren` are (`$WARREN_BIN_DIR`, default
/// `<repo>/target/release`).
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("WARREN_BIN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => repo_root().join("target/release"),
    }
}

/// Runs the `warren` CLI against the daemon or gateway at `url` (`unix://…` or `http://…`).
pub fn warren_at(url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin_dir().join("warren"))
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("running warren")
}

/// The image store the test daemons use (`$WARREN_IMAGE_STORE`, default
/// `/var/lib/warren/images`).
pub fn image_store() -> PathBuf {
    match std::env::var_os("WARREN_IMAGE_STORE") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/var/lib/warren/images"),
    }
}

/// Why this host cannot run real sandboxes, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("integration tests need root (they create namespaces and cgroups)".into());
    }
    for bin in ["warrend", "warren-agent"] {
        let p = bin_dir().join(bin);
        if !p.is_file() {
            return Some(format!(
                "{} is missing; build it with `cargo build --release -p warrend -p warren-agent \
                 -p warren-cli` or set WARREN_BIN_DIR",
                p.display()
            ));
        }
    }
    None
}

pub mod netslot;

// Test binaries that use both this and another helper module load the rule twice.
#[allow(clippy::duplicate_mod)]
#[path = "../../../../tests/skip.rs"]
mod skip_rule;
pub use skip_rule::skip;

/// Prints the skip line when the host cannot run the tests (a failure under `CI=true`); true
/// when the test must return.
pub fn should_skip() -> bool {
    match skip_reason() {
        Some(why) => {
            skip(why);
            true
        }
        None => false,
    }
}

/// The key that groups the daemons of one test run: nextest's run id, else the parent
/// process (cargo runs every test binary of `cargo test` as its child).
pub fn run_key() -> String {
    match std::env::var("NEXTEST_RUN_ID") {
        Ok(id) if !id.is_empty() => format!("nextest-{id}"),
        _ => format!("ppid-{}", nix::unistd::getppid()),
    }
}

/// The registry of this run: one file per daemon node (`<node>` = "running", then
/// "stopped"), and `mounts.before` (the host's mount table before the first daemon).
pub fn run_dir() -> PathBuf {
    test_root().join("runs").join(run_key())
}

fn mark_node(node: &str, what: &str) {
    let dir = run_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(node), what);
}

/// Records the host mount table once per run, before any sandbox of the run exists.
fn snapshot_mounts_once() {
    let dir = run_dir();
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("mounts.before");
    if path.exists() {
        return;
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let tmp = dir.join(format!("mounts.before.{}", std::process::id()));
    if std::fs::write(&tmp, table).is_ok() && std::fs::hard_link(&tmp, &path).is_err() {
        // Another test was first; its snapshot stands.
    }
    let _ = std::fs::remove_file(&tmp);
}

fn to_base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// A node name unique on this host for a long while: `t` + pid + counter + time, all in
/// base 36, at most 16 characters of `[a-z0-9]`.
fn new_node_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst) as u64;
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = format!(
        "t{}{}{}",
        to_base36(std::process::id() as u64),
        to_base36(n),
        to_base36(secs % (36 * 36 * 36))
    );
    assert!(name.len() <= 16, "node name {name} is too long");
    name
}

/// An image store of its own at `dir` holding image `default` (its layers hard-linked from
/// [`image_store`], copied only across file systems), for a test that needs a store no other
/// test's daemon uses.
pub fn private_store(dir: &Path) -> PathBuf {
    ensure_default_image();
    let from = image_store();
    let manifest = std::fs::read(from.join("images/default/latest.json"))
        .expect("reading image default's manifest");
    let v: serde_json::Value =
        serde_json::from_slice(&manifest).expect("image default's manifest is JSON");
    for sub in ["blobs/sha256", "layers", "images/default"] {
        std::fs::create_dir_all(dir.join(sub)).expect("creating the private store");
    }
    let layers = v["layers"].as_array().expect("the manifest lists layers");
    for l in layers {
        let hex = l
            .as_str()
            .and_then(|l| l.strip_prefix("sha256:"))
            .expect("a layer digest");
        let blob = Path::new("blobs/sha256").join(hex);
        if std::fs::hard_link(from.join(&blob), dir.join(&blob)).is_err() {
            std::fs::copy(from.join(&blob), dir.join(&blob)).expect("copying a layer");
        }
        let meta = Path::new("layers").join(format!("{hex}.json"));
        let _ = std::fs::copy(from.join(&meta), dir.join(&meta));
    }
    std::fs::write(dir.join("images/default/latest.json"), manifest)
        .expect("writing image default's manifest");
    dir.to_path_buf()
}

/// Makes sure image `default` is in the store: registers the cached rootfs with
/// `warren image build-layer` when that subcommand exists, else fails with what to run.
pub fn ensure_default_image() {
    let store = image_store();
    let manifest = store.join("images/default/latest.json");
    if manifest.is_file() {
        return;
    }
    let cache = std::env::var_os("WARREN_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/warren"));
    let rootfs = cache.join("rootfs-default");
    let warren = bin_dir().join("warren");
    let has_cmd = Command::new(&warren)
        .args(["image", "build-layer", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        has_cmd,
        "image `default` is not registered in {} and `{} image build-layer` does not exist; \
         register it with scripts/build-default-image.sh",
        store.display(),
        warren.display()
    );
    assert!(
        rootfs.is_dir(),
        "image `default` is not registered in {} and its rootfs {} is missing; run \
         scripts/build-default-image.sh",
        store.display(),
        rootfs.display()
    );
    // One registration at a time across test processes.
    std::fs::create_dir_all(test_root()).unwrap();
    let lock = File::create(test_root().join(".image.lock")).unwrap();
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("locking the image registration");
    if manifest.is_file() {
        return;
    }
    let out = Command::new(&warren)
        .arg("image")
        .arg("build-layer")
        .arg(&rootfs)
        .args(["--tag", "default", "--store"])
        .arg(&store)
        .output()
        .expect("running warren image build-layer");
    assert!(
        out.status.success() && manifest.is_file(),
        "`warren image build-layer {} --tag default --store {}` failed: {}{}",
        rootfs.display(),
        store.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private `warrend`: its own socket, state directory and node name. Dropping it deletes
/// every sandbox it holds (sandboxes outlive their daemon by design), stops it with SIGTERM
/// and waits for it.
pub struct Daemon {
    pub node: String,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    /// The image store it uses ([`image_store`] unless started with
    /// [`Daemon::start_on_store`]).
    pub image_store: PathBuf,
    child: Option<Child>,
    client: Client,
    /// Extra `warrend` arguments (e.g. `--network-config FILE`), kept across restarts.
    pub extra_args: Vec<String>,
}

impl Daemon {
    /// Starts a daemon, or prints `SKIP: <why>` and returns `None` when the host cannot run
    /// sandboxes. Panics when the daemon does not come up.
    pub async fn start() -> Option<Daemon> {
        Self::start_with(|_| Vec::new()).await
    }

    /// Like [`Daemon::start`], with extra `warrend` arguments made from the daemon's own
    /// directory (for config files written there).
    pub async fn start_with(args: impl FnOnce(&Path) -> Vec<String>) -> Option<Daemon> {
        Self::start_on_store(image_store(), args).await
    }

    /// Like [`Daemon::start_with`], on the image store at `store` (which must hold what the
    /// test creates; see [`private_store`]).
    pub async fn start_on_store(
        store: PathBuf,
        args: impl FnOnce(&Path) -> Vec<String>,
    ) -> Option<Daemon> {
        if should_skip() {
            return None;
        }
        ensure_default_image();
        snapshot_mounts_once();
        let node = new_node_name();
        let dir = test_root().join(&node);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the daemon directory");
        let socket = dir.join("warrend.sock");
        let mut d = Daemon {
            state_dir: dir.join("state"),
            log: dir.join("warrend.log"),
            image_store: store,
            client: client_for(&socket),
            socket,
            dir,
            node,
            child: None,
            extra_args: Vec::new(),
        };
        d.extra_args = args(&d.dir);
        mark_node(&d.node, "running");
        d.spawn().await;
        Some(d)
    }

    /// The client of this daemon.
    /// A daemon with an auth file of `tenants` (name, role, token), listening on a free
    /// loopback port besides its socket; returns it with that port.
    pub async fn start_with_tenants(tenants: &[(&str, &str, &str)]) -> Option<(Daemon, u16)> {
        use sha2::Digest;
        let auth: String = tenants
            .iter()
            .map(|(name, role, token)| {
                format!(
                    "[[tenant]]\nname = \"{name}\"\nrole = \"{role}\"\ntoken_sha256 = [\"{}\"]\n\n",
                    hex::encode(sha2::Sha256::digest(token.as_bytes()))
                )
            })
            .collect();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("finding a free port");
        let d = Daemon::start_with(move |dir: &Path| {
            let file = dir.join("auth.toml");
            std::fs::write(&file, auth).unwrap();
            vec![
                "--auth".into(),
                file.display().to_string(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
            ]
        })
        .await?;
        Some((d, port))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The daemon's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Starts the daemon process again (after [`Daemon::stop`]).
    pub async fn spawn(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening the daemon log");
        // The shared image store, unless the extra arguments name one of the daemon's own.
        let store = match self.extra_args.iter().any(|a| a == "--image-store") {
            true => Vec::new(),
            false => vec![
                "--image-store".into(),
                self.image_store.clone().into_os_string(),
            ],
        };
        let child = Command::new(bin_dir().join("warrend"))
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--node")
            .arg(&self.node)
            .args(store)
            .args(&self.extra_args)
            // Requests are logged at debug level: the log shows which calls were answered.
            .env("RUST_LOG", "info,warren_node=debug,warren_cluster=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawning warrend");
        self.child = Some(child);
        self.client = client_for(&self.socket);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "warrend (node {}) exited during start-up with {status}; log:\n{}",
                    self.node,
                    self.log_tail(40)
                );
            }
            if let Ok(Ok(h)) =
                tokio::time::timeout(Duration::from_secs(2), self.client.health()).await
            {
                assert!(h.is_ok(), "health is not ok: {h:?}");
                assert_eq!(h.node, self.node);
                return;
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "warrend (node {}) did not answer /v1/health within {START_TIMEOUT:?}; log:\n{}",
                self.node,
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the daemon with SIGTERM and waits for it; its sandboxes keep running.
    pub async fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the daemon is running");
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGTERM).expect("sending SIGTERM to warrend");
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("waiting for warrend") {
                return status;
            }
            if started.elapsed() > STOP_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "warrend (node {}) did not exit within {STOP_TIMEOUT:?} of SIGTERM; log:\n{}",
                    self.node,
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `sig` to the daemon (SIGSTOP to hang it, SIGCONT to let it go on).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("the daemon is running");
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), sig).expect("signal warrend");
    }

    /// Kills the daemon with SIGKILL (no clean-up of any kind) and reaps it; its sandboxes
    /// keep running, for [`Daemon::spawn`] to re-adopt.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("the daemon is running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the daemon (SIGTERM) and starts a new one with the same socket, state directory
    /// and node name.
    pub async fn restart(&mut self) {
        let status = self.stop().await;
        assert!(
            status.success(),
            "warrend exited with {status} after SIGTERM; log:\n{}",
            self.log_tail(40)
        );
        self.spawn().await;
    }

    /// The last `lines` lines of the daemon's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut f = match File::open(&self.log) {
            Ok(f) => f,
            Err(e) => return format!("(no log: {e})"),
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let all: Vec<&str> = s.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Creates a sandbox, panicking with the daemon's answer when it fails.
    pub async fn create(&self, req: &CreateSandboxRequest) -> SandboxInfo {
        match self.client.create(req).await {
            Ok(info) => info,
            Err(e) => panic!("create {req:?} failed: {e}; log:\n{}", self.log_tail(20)),
        }
    }

    /// Creates a sandbox with the node's defaults and returns its id.
    pub async fn sandbox(&self) -> String {
        self.create(&CreateSandboxRequest::default()).await.id
    }

    /// Runs `req`, panicking when the call itself fails.
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> ExecResult {
        match self.client.exec(id, req).await {
            Ok(r) => r,
            Err(e) => panic!(
                "exec {req:?} in {id} failed: {e}; log:\n{}",
                self.log_tail(20)
            ),
        }
    }

    /// Runs a shell command and returns its result.
    pub async fn sh(&self, id: &str, cmd: &str) -> ExecResult {
        self.exec(id, &ExecRequest::shell(cmd)).await
    }

    /// Runs a shell command that must exit 0 and returns its stdout.
    pub async fn sh_ok(&self, id: &str, cmd: &str) -> String {
        let r = self.sh(id, cmd).await;
        assert!(
            r.success(),
            "`{cmd}` in {id} failed: exit {:?} signal {:?}\nstdout: {}\nstderr: {}",
            r.exit_code,
            r.signal,
            r.stdout,
            r.stderr
        );
        r.stdout
    }

    /// The processes visible inside the sandbox, one `PID CMDLINE` line each.
    pub async fn ps(&self, id: &str) -> String {
        self.sh_ok(id, PS).await
    }

    /// Every sandbox the daemon lists.
    pub async fn list(&self) -> Vec<SandboxInfo> {
        self.client
            .list(&BTreeMap::new(), None)
            .await
            .expect("listing sandboxes")
    }

    /// The cgroup directories of sandbox `id` (or of the node when `id` is empty) that exist
    /// in any hierarchy.
    pub fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        node_cgroup_dirs(&self.node)
            .into_iter()
            .map(|d| if id.is_empty() { d } else { d.join(id) })
            .filter(|d| d.is_dir())
            .collect()
    }

    /// Pids of sandbox `id`, read from its cgroups and their leaves (the agent's first,
    /// then its commands').
    pub fn sandbox_pids(&self, id: &str) -> Vec<u32> {
        let mut pids = Vec::new();
        let groups = self.cgroup_dirs(id).into_iter().flat_map(|d| {
            let leaves = ["agent", "commands"].map(|l| d.join(l));
            std::iter::once(d).chain(leaves)
        });
        for d in groups {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                for p in s.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                    if !pids.contains(&p) {
                        pids.push(p);
                    }
                }
            }
        }
        pids
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            self.stop_for_good(child);
        }
        mark_node(&self.node, "stopped");
        // Kept only for a failing test (its log and state tell what went wrong); a daemon a
        // test stopped or killed itself is cleaned up like any other. Never through a mount
        // (a sandbox left running keeps its root file system there; the leak check names it).
        if !std::thread::panicking() {
            if mounts_under(&self.dir) {
                eprintln!(
                    "warren-tests: node {} still has mounts in {}; its files are kept",
                    self.node,
                    self.dir.display()
                );
            } else {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        } else {
            eprintln!(
                "warren-tests: daemon files of node {} kept in {}",
                self.node,
                self.dir.display()
            );
        }
    }
}

impl Daemon {
    /// Deletes the daemon's sandboxes, then stops it (SIGTERM; SIGKILL after [`STOP_TIMEOUT`]).
    fn stop_for_good(&self, mut child: std::process::Child) {
        // Sandboxes survive their daemon by design: delete them first. A fresh thread with
        // its own runtime works whether or not this drop runs inside a runtime.
        let socket = self.socket.clone();
        let deleted = std::thread::spawn(move || delete_all(&socket))
            .join()
            .unwrap_or_else(|_| Err("the clean-up thread panicked".into()));
        if let Err(e) = deleted {
            eprintln!("warren-tests: cleaning up node {}: {e}", self.node);
        }
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let started = Instant::now();
        let mut exited = false;
        while started.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !exited {
            eprintln!(
                "warren-tests: warrend (node {}) ignored SIGTERM for {STOP_TIMEOUT:?}; killing it",
                self.node
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether anything is mounted at or below `dir` (from this process's mount table).
fn mounts_under(dir: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| Path::new(mp).starts_with(dir))
}

/// A client of the daemon at `socket`. Every call must be answered within
/// [`CALL_TIMEOUT`]: a hung call fails its test instead of hanging the suite.
fn client_for(socket: &Path) -> Client {
    Client::builder()
        .url(format!("unix://{}", socket.display()))
        .max_connections(64)
        .request_timeout(Some(CALL_TIMEOUT))
        .build()
        .expect("building the client")
}

/// Deletes every sandbox of the daemon at `socket`.
fn delete_all(socket: &Path) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = client_for(socket);
        let list =
            tokio::time::timeout(Duration::from_secs(10), client.list(&BTreeMap::new(), None))
                .await
                .map_err(|_| "listing sandboxes timed out".to_string())?
                .map_err(|e| format!("listing sandboxes: {e}"))?;
        let errors: Vec<String> = futures::stream::iter(list)
            .map(|sb| {
                let client = client.clone();
                async move {
                    match tokio::time::timeout(Duration::from_secs(30), client.delete(&sb.id)).await
                    {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) if e.is_not_found() => None,
                        Ok(Err(e)) => Some(format!("deleting {}: {e}", sb.id)),
                        Err(_) => Some(format!("deleting {} timed out", sb.id)),
                    }
                }
            })
            .buffer_unordered(16)
            .filter_map(|e| async move { e })
            .collect()
            .await;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    })
}

/// The parent cgroup directories a daemon of `node` uses: `warren-<node>` under the cgroup
/// root (v2) and under every hierarchy mounted below it (v1, hybrid).
pub fn node_cgroup_dirs(node: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let name = format!("warren-{node}");
    let mut dirs = vec![root.join(&name)];
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs.push(e.path().join(&name));
            }
        }
    }
    dirs
}

/// A well-formed sandbox id of `node` that no daemon ever made.
pub fn unknown_id(node: &str) -> String {
    format!("{node}-01jd0m7x4e8k0k9yq1w2e3r4t5")
}

/// A trajectory store (a directory) of one test under the test root, removed when it ends.
pub struct StoreDir(pub PathBuf);

impl StoreDir {
    /// A new, empty store named `name` plus this process and the time.
    pub fn new(name: &str) -> StoreDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let store = StoreDir(test_root().join(format!("{name}-{}-{nanos}", std::process::id())));
        std::fs::create_dir_all(&store.0).expect("creating the trajectory store");
        store
    }

    /// The daemon arguments that ship to this store.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--trajectory-store".to_string(),
            self.0.display().to_string(),
        ]
    }
}

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether a shipped segment of `id`'s log in the trajectory store `store` holds `needle`.
pub fn shipped(store: &Path, id: &str, needle: &str) -> bool {
    let Ok(rd) = std::fs::read_dir(store.join("trajectories").join(id)) else {
        return false;
    };
    rd.flatten().any(|e| {
        e.file_name().to_string_lossy().ends_with(".jsonl")
            && std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains(needle))
    })
}

/// Asserts that the processes `pids` of a fenced original (a sandbox revived elsewhere) are gone
/// within 30 s and, when `copy` is given, that `node`'s log says why, naming the copy.
pub async fn assert_original_gone(node: &Daemon, pids: &[u32], copy: Option<&str>) {
    let left = wait_for(Duration::from_secs(30), || async {
        pids.iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
            .then_some(())
    })
    .await;
    assert!(
        left.is_some(),
        "processes of the original are left: {pids:?}"
    );
    if let Some(copy) = copy {
        let log = node.log_tail(200);
        assert!(
            log.contains("revived on another node") && log.contains(copy),
            "the log does not say why the original went:\n{log}"
        );
    }
}

/// Polls `f` every 50 ms until it returns `Some`, or `None` after `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One raw HTTP/1.1 exchange over the daemon's Unix socket: `(status, content type, body)`.
/// For requests the typed client would refuse to build.
pub async fn raw_request(
    socket: &Path,
    method: &str,
    path_and_query: &str,
    content_type: Option<&str>,
    body: impl Into<bytes::Bytes>,
) -> (u16, String, bytes::Bytes) {
    let (status, headers, body) =
        raw_request_with(socket, method, path_and_query, content_type, &[], body).await;
    let ct = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, ct, body)
}

/// Like [`raw_request`], with extra request headers; answers the response's headers.
pub async fn raw_request_with(
    socket: &Path,
    method: &str,
    path_and_query: &str,
    content_type: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<bytes::Bytes>,
) -> (u16, hyper::HeaderMap, bytes::Bytes) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connecting to the daemon socket");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP handshake");
    let conn = tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(hyper::header::HOST, "localhost");
    if let Some(ct) = content_type {
        req = req.header(hyper::header::CONTENT_TYPE, ct);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(body.into()))
        .expect("building a raw request");
    let resp = sender
        .send_request(req)
        .await
        .unwrap_or_else(|e| panic!("{method} {path_and_query}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("reading a raw response")
        .to_bytes();
    drop(sender);
    conn.abort();
    (status, headers, body)
}
