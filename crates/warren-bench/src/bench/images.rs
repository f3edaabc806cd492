//! `warren-bench images`: lazy layers vs eager layer downloads vs classic tar unpacking.
//!
//! Generates N distinct images (EROFS + tar, see `images_gen`), serves them from a separate
//! blob-server process with a bandwidth cap, then, for each mode, starts as many sandboxes as
//! admitted, each reading a fixed ~10% of its image and running a short command:
//!
//! - `lazy`: a fresh `warrend --blob-mode lazy`: chunks are fetched on first read;
//! - `eager`: a fresh `warrend --blob-mode eager`: each layer is downloaded and verified whole
//!   before it is mounted;
//! - `tar`: each image's tar is downloaded and unpacked into a directory (once per image, as a
//!   container runtime's snapshotter does), and the same reads run in a fresh mount+pid
//!   namespace over that directory.
//!
//! Measured per mode: wall time until every sandbox finished, bytes written to local disk by
//! the node's processes (`write_bytes` of `/proc/self/io` after they are reaped) and by the
//! whole device (`/sys/dev/block/M:m/stat`, shared with anything else on the host), and the
//! device's peak write rate (250 ms samples).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_client::Client;
use warren_types::{CreateSandboxRequest, ExecRequest, ImageRef};

use super::daemon::Daemon;
use super::images_gen::{generate, GenImage, GenParams};

#[derive(Debug, Clone, clap::Args)]
pub struct ImagesArgs {
    /// images: how many distinct images
    #[arg(long, default_value_t = 8)]
    pub img_count: usize,
    /// images: file bytes per image, MiB
    #[arg(long, default_value_t = 300)]
    pub img_mb: u64,
    /// images: sandboxes per mode
    #[arg(long, default_value_t = 64)]
    pub img_sandboxes: usize,
    /// images: percent of each image's bytes a sandbox reads
    #[arg(long, default_value_t = 10)]
    pub img_read_pct: u64,
    /// images: blob server bandwidth cap, MB/s (0 = none)
    #[arg(long, default_value_t = 100)]
    pub img_rate_mbps: u64,
    /// images: what the blob server serves (the "remote" side; tmpfs keeps it off the disk)
    #[arg(long, default_value = "/dev/shm/warren-bench-images")]
    pub img_served: PathBuf,
    /// images: node-side work directory (caches, unpacked trees, daemon state) on the disk
    /// under test
    #[arg(long, default_value = "/var/tmp/warren-bench-images")]
    pub img_work: PathBuf,
    /// images: modes to run, comma-separated (lazy, eager, tar)
    #[arg(long, default_value = "lazy,eager,tar")]
    pub img_modes: String,
    /// images: keep the generated images for the next run
    #[arg(long)]
    pub img_keep: bool,
    /// (internal) serve this directory as the blob server and print the port
    #[arg(long, hide = true)]
    pub serve_blobs: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct ModeResult {
    pub mode: String,
    pub sandboxes: usize,
    pub ok: usize,
    pub first_error: Option<String>,
    pub wall_secs: f64,
    /// Bytes the node's processes caused to be written (task I/O accounting).
    pub process_write_bytes: u64,
    /// Bytes written to the device under the work directory (whole device).
    pub device_write_bytes: u64,
    pub peak_write_mbps: f64,
}

#[derive(Debug, Serialize)]
pub struct ImagesReport {
    pub images: usize,
    pub image_mib: u64,
    pub read_pct: u64,
    pub rate_mbps: u64,
    pub modes: Vec<ModeResult>,
    pub checks: Vec<super::Check>,
}

fn self_write_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| {
                    l.strip_prefix("write_bytes:")
                        .map(|v| v.trim().parse().ok())
                })
                .flatten()
        })
        .unwrap_or(0)
}

/// `/sys/dev/block/M:m/stat` of the device holding `p` (the whole disk if a partition has none).
fn device_stat(p: &Path) -> Option<PathBuf> {
    let dev = std::fs::metadata(p).ok()?.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let s = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"));
    s.exists().then_some(s)
}

fn sectors_written(stat: &Path) -> u64 {
    std::fs::read_to_string(stat)
        .ok()
        .and_then(|s| s.split_whitespace().nth(6).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Samples the device's written bytes until stopped; returns (total, peak MB/s).
struct DiskSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(u64, f64)>>,
}

impl DiskSampler {
    fn start(stat: Option<PathBuf>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let Some(stat) = stat else { return (0, 0.0) };
            let first = sectors_written(&stat);
            let (mut last, mut t_last, mut peak) = (first, Instant::now(), 0f64);
            while !s2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                let now = sectors_written(&stat);
                let dt = t_last.elapsed().as_secs_f64();
                peak = peak.max((now - last) as f64 * 512.0 / dt / 1e6);
                (last, t_last) = (now, Instant::now());
            }
            ((sectors_written(&stat) - first) * 512, peak)
        });
        DiskSampler {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or((0, 0.0))
    }
}

/// The blob server, a child process (`warren-bench images --serve-blobs DIR`).
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(dir: &Path, rate: u64) -> Result<Server> {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["images", "--serve-blobs"])
        .arg(dir)
        .arg("--img-rate-mbps")
        .arg(rate.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the blob server")?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("server stdout")?)
        .read_line(&mut line)
        .context("reading the blob server's port")?;
    let url = line.trim().to_string();
    if !url.starts_with("http://") {
        let _ = child.kill();
        bail!("the blob server did not start: {url:?}");
    }
    Ok(Server { child, url })
}

/// The hidden `--serve-blobs` entry point.
pub async fn serve_blobs(dir: PathBuf, rate_mbps: u64) -> Result<i32> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("http://{}", l.local_addr()?);
    let stats = Arc::new(warren_blob::serve::ServeStats::default());
    warren_blob::serve::serve(l, dir, rate_mbps * 1_000_000, stats).await?;
    Ok(0)
}

/// A private `warrend` for one mode, on an image store of its own.
struct ModeDaemon {
    daemon: Daemon,
    store: PathBuf,
    client: Client,
}

fn default_store() -> PathBuf {
    std::env::var("WARREN_IMAGE_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/lib/warren/images"))
}

/// A store of its own holding only the `default` image (its blobs linked, not copied).
fn bench_store(dir: &Path) -> Result<PathBuf> {
    let src = warren_image::ImageStore::open(default_store())?;
    let m = src
        .manifest("default")
        .context("the default image (scripts/build-default-image.sh)")?;
    let store = dir.join("store");
    let dst = warren_image::ImageStore::open(&store)?;
    for l in &m.layers {
        let to = dst.blob_path(l)?;
        if !to.exists() {
            std::os::unix::fs::symlink(src.blob_path(l)?, &to)?;
        }
    }
    dst.put_manifest(&m)?;
    Ok(store)
}

impl ModeDaemon {
    async fn start(
        work: &Path,
        mode: &str,
        blob_url: &str,
        sandboxes: usize,
    ) -> Result<ModeDaemon> {
        let dir = work.join(format!("node-{mode}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let store = bench_store(&dir)?;
        let daemon = Daemon::new(&dir, &format!("bimg{mode}"))?;
        let client = daemon.client(sandboxes + 8)?;
        let mut d = ModeDaemon {
            daemon,
            store,
            client,
        };
        let (store, cache) = (d.store.clone(), dir.join("cache"));
        let flags = |cmd: &mut Command| {
            cmd.arg("--image-store")
                .arg(&store)
                .args(["--blob-store", blob_url, "--blob-mode", mode])
                .arg("--blob-cache")
                .arg(&cache);
        };
        let started = d
            .daemon
            .start(flags, &d.client, Duration::from_secs(10))
            .await;
        if started.is_err() {
            d.stop();
        }
        started.map(|()| d)
    }

    fn dir(&self) -> &Path {
        self.daemon.dir()
    }

    /// Unmounts the layers, stops the daemon and reaps it (its I/O counts join ours).
    fn stop(&mut self) {
        if let Ok(s) = warren_image::ImageStore::open(&self.store) {
            s.unmount_all();
        }
        self.daemon.stop();
    }
}

fn read_cmd(img: &GenImage, root: &str) -> String {
    let mut s = format!("cd {root} && cat");
    for f in &img.read {
        s.push(' ');
        s.push_str(f);
    }
    s.push_str(" > /dev/null && ls big | wc -l > /dev/null && echo ok");
    s
}

/// One sandbox through the daemon: create, read, run, delete.
async fn one_sandbox(client: &Client, img: &GenImage) -> Result<()> {
    let req = CreateSandboxRequest {
        image: ImageRef::Stack(vec!["default".into(), img.digest.clone()]),
        ..Default::default()
    };
    let sb = client.create(&req).await.context("create")?;
    let r = client
        .exec(
            sb.id.as_str(),
            &ExecRequest {
                shell: Some(read_cmd(img, "/data")),
                timeout_secs: Some(600.0),
                ..Default::default()
            },
        )
        .await;
    let _ = client.delete(sb.id.as_str()).await;
    let r = r.context("exec")?;
    if r.exit_code != Some(0) || r.stdout.trim() != "ok" {
        bail!(
            "workload failed: exit {:?}: {}",
            r.exit_code,
            r.stderr.trim()
        );
    }
    Ok(())
}

async fn run_daemon_mode(
    a: &ImagesArgs,
    mode: &str,
    url: &str,
    images: &[GenImage],
) -> Result<ModeResult> {
    let mut d = ModeDaemon::start(&a.img_work, mode, url, a.img_sandboxes).await?;
    let w0 = self_write_bytes();
    let sampler = DiskSampler::start(device_stat(d.dir()));
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..a.img_sandboxes {
        let client = d.client.clone();
        let img = images[k % images.len()].clone();
        tasks.spawn(async move { one_sandbox(&client, &img).await });
    }
    let mut res = ModeResult {
        mode: mode.into(),
        sandboxes: a.img_sandboxes,
        ..Default::default()
    };
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => res.ok += 1,
            Ok(Err(e)) => {
                res.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
            Err(e) => {
                res.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    res.wall_secs = t.elapsed().as_secs_f64();
    let _ = Command::new("sync").status();
    (res.device_write_bytes, res.peak_write_mbps) = sampler.finish();
    d.stop();
    res.process_write_bytes = self_write_bytes().saturating_sub(w0);
    let _ = std::fs::remove_dir_all(d.dir());
    Ok(res)
}

/// Classic: download each tar and unpack it (once per image), then every sandbox reads its
/// files in a fresh mount+pid namespace over the unpacked tree.
async fn run_tar_mode(a: &ImagesArgs, url: &str, images: &[GenImage]) -> Result<ModeResult> {
    let dir = a.img_work.join("node-tar");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let w0 = self_write_bytes();
    let sampler = DiskSampler::start(device_stat(&dir));
    let t = Instant::now();
    let mut unpacked = Vec::new();
    for (i, img) in images.iter().enumerate() {
        let to = dir.join(format!("img-{i}"));
        std::fs::create_dir_all(&to)?;
        let script = format!(
            "set -o pipefail; curl -sf {url}/{} | tar -x -C {}",
            img.tar_key,
            to.display()
        );
        unpacked.push(tokio::spawn(async move {
            let s = tokio::process::Command::new("bash")
                .args(["-c", &script])
                .status()
                .await?;
            anyhow::ensure!(s.success(), "download and unpack failed: {s}");
            Ok::<PathBuf, anyhow::Error>(to)
        }));
    }
    let mut roots = Vec::new();
    for u in unpacked {
        roots.push(u.await?);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..a.img_sandboxes {
        let i = k % images.len();
        let img = images[i].clone();
        let root = roots[i]
            .as_ref()
            .map(|r| r.join("data"))
            .map_err(|e| format!("{e:#}"));
        tasks.spawn(async move {
            let root = root.map_err(|e| anyhow::anyhow!(e))?;
            let out = tokio::process::Command::new("unshare")
                .args([
                    "--mount",
                    "--pid",
                    "--fork",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                ])
                .arg(read_cmd(&img, &root.display().to_string()))
                .output()
                .await?;
            anyhow::ensure!(
                out.status.success(),
                "workload failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        });
    }
    let mut res = ModeResult {
        mode: "tar".into(),
        sandboxes: a.img_sandboxes,
        ..Default::default()
    };
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => res.ok += 1,
            Ok(Err(e)) => {
                res.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
            Err(e) => {
                res.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    res.wall_secs = t.elapsed().as_secs_f64();
    let _ = Command::new("sync").status();
    (res.device_write_bytes, res.peak_write_mbps) = sampler.finish();
    res.process_write_bytes = self_write_bytes().saturating_sub(w0);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(res)
}

pub async fn run(a: &ImagesArgs, json: bool, report_dir: Option<&Path>) -> Result<i32> {
    if let Some(dir) = &a.serve_blobs {
        return serve_blobs(dir.clone(), a.img_rate_mbps).await;
    }
    let modes: Vec<String> = a
        .img_modes
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    if let Some(m) = modes
        .iter()
        .find(|m| !["lazy", "eager", "tar"].contains(&m.as_str()))
    {
        bail!("unknown mode {m:?} (lazy, eager, tar)");
    }
    std::fs::create_dir_all(&a.img_work)?;
    let params = GenParams {
        layout: 2,
        images: a.img_count.max(1),
        mb: a.img_mb,
        read_pct: a.img_read_pct,
    };
    let scratch = a.img_work.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let images = tokio::task::block_in_place(|| generate(&a.img_served, &scratch, &params))?;
    let _ = std::fs::remove_dir_all(&scratch);
    let server = start_server(&a.img_served, a.img_rate_mbps)?;
    let mut results = Vec::new();
    let mut failure = None;
    for m in &modes {
        eprintln!("bench images: mode {m}: {} sandboxes", a.img_sandboxes);
        let r = match m.as_str() {
            "tar" => run_tar_mode(a, &server.url, &images).await,
            m => run_daemon_mode(a, m, &server.url, &images).await,
        };
        match r {
            Ok(r) => {
                eprintln!(
                    "bench images: mode {m}: {}/{} ok in {:.2} s, node wrote {} MiB",
                    r.ok,
                    r.sandboxes,
                    r.wall_secs,
                    r.process_write_bytes >> 20
                );
                results.push(r)
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    drop(server);
    if !a.img_keep {
        let _ = std::fs::remove_dir_all(&a.img_served);
    }
    let _ = std::fs::remove_dir(&a.img_work);
    if let Some(e) = failure {
        return Err(e);
    }
    let mut report = ImagesReport {
        images: images.len(),
        image_mib: a.img_mb,
        read_pct: a.img_read_pct,
        rate_mbps: a.img_rate_mbps,
        modes: results,
        checks: Vec::new(),
    };
    let get = |m: &str| report.modes.iter().find(|r| r.mode == m).cloned();
    if let (Some(l), Some(e)) = (get("lazy"), get("eager")) {
        if e.wall_secs > 0.0 && e.process_write_bytes > 0 {
            report.checks.push(super::Check::at_most(
                "lazy / eager wall time",
                l.wall_secs / e.wall_secs,
                "x",
                0.5,
            ));
            report.checks.push(super::Check::at_most(
                "lazy / eager bytes written",
                l.process_write_bytes as f64 / e.process_write_bytes as f64,
                "x",
                0.3,
            ));
        }
    }
    let failed = report.modes.iter().any(|m| m.ok != m.sandboxes);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    super::report::write_if(report_dir, || images_page(&report, render(&report)))?;
    Ok(if failed { 1 } else { 0 })
}

fn render(r: &ImagesReport) -> String {
    use crate::table::Table;
    let mut t = Table::new([
        "MODE",
        "OK",
        "WALL s",
        "NODE WROTE MiB",
        "DEVICE WROTE MiB",
        "PEAK MB/s",
        "FIRST ERROR",
    ]);
    for m in &r.modes {
        t.row([
            m.mode.clone(),
            format!("{}/{}", m.ok, m.sandboxes),
            format!("{:.2}", m.wall_secs),
            format!("{}", m.process_write_bytes >> 20),
            format!("{}", m.device_write_bytes >> 20),
            format!("{:.0}", m.peak_write_mbps),
            m.first_error.clone().unwrap_or_default(),
        ]);
    }
    let mut out = format!(
        "{} images x {} MiB, each sandbox reads {}%, blob server capped at {} MB/s\n",
        r.images, r.image_mib, r.read_pct, r.rate_mbps
    );
    out.push_str(&t.render());
    if !r.checks.is_empty() {
        let mut c = Table::new(["CHECK", "VALUE", "TARGET", "RESULT"]);
        for k in &r.checks {
            c.row([
                k.metric.clone(),
                format!("{:.3} {}", k.value, k.unit),
                format!("{} {}", k.target, k.unit),
                if k.pass {
                    "PASS".into()
                } else {
                    "MISS".to_string()
                },
            ]);
        }
        out.push('\n');
        out.push_str(&c.render());
    }
    out
}

/// The page of `bench images`, with the start times and bytes written per mode as bars.
pub fn images_page(r: &ImagesReport, text: String) -> anyhow::Result<super::report::Page> {
    let mut page = super::report::Page::new("warren bench images", text, r)?;
    if !r.modes.is_empty() {
        let bars = |f: fn(&ModeResult) -> f64| -> Vec<(String, f64)> {
            r.modes.iter().map(|m| (m.mode.clone(), f(m))).collect()
        };
        page.plots.push(super::report::Plot {
            file: "images-wall.svg".into(),
            caption: format!(
                "Wall time to start {} sandboxes of {} images per mode (lazy, eager, \
                 tar-unpacked layers)",
                r.modes[0].sandboxes, r.images
            ),
            svg: super::report::plots::bars(
                "image start: wall time",
                "mode",
                "seconds",
                &bars(|m| m.wall_secs),
            )?,
        });
        page.plots.push(super::report::Plot {
            file: "images-written.svg".into(),
            caption: "Bytes the node's processes wrote per mode".into(),
            svg: super::report::plots::bars(
                "image start: bytes written",
                "mode",
                "MiB",
                &bars(|m| m.process_write_bytes as f64 / (1u64 << 20) as f64),
            )?,
        });
    }
    Ok(page)
}
