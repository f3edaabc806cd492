//! `warren-bench build`: Dockerfile builds (not part of `all`).
//!
//! 1. A cold build of a 6-step Dockerfile — a package install (`dpkg -i` of a `.deb` the
//!    bench makes with `dpkg-deb`), a `pip install` of a wheel the bench makes from a PEP 503
//!    simple index the bench lays out (`index/simple/<name>/`, served on the step's own
//!    loopback by `python3 -m http.server` for the `pip install` — the build has no network,
//!    podman's neither — and pip run from its own wheel, the host's), copies — through the
//!    node (`--no-cache`), and `podman build --no-cache` of the same file and context in the
//!    same run, from a base podman imports from the node's own image (a tar of its layer).
//! 2. The cached rebuild of the same file (every step from the cache).
//! 3. 100 task images from one base, each adding its own files: the bytes of the layers they
//!    hold (each counted once) against the base's plus each task's own layers.
//!
//! Needs the node's layer store on this host (`--store`, to read the base for podman and the
//! layers' sizes) and, for the podman half, `podman` and `dpkg-deb`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{BuildEvent, BuildOptions};

use super::measure::Setup;

/// What the build bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct BuildBench {
    pub cold_secs: f64,
    /// `podman build --no-cache` of the same file and context (none when podman is absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub podman_cold_secs: Option<f64>,
    pub cached_secs: f64,
    pub cached_steps_run: usize,
    pub tasks: usize,
    /// Bytes of all layers the task images hold, each layer once.
    pub tasks_disk_bytes: u64,
    /// The base's bytes plus each task's own layers.
    pub base_plus_changes_bytes: u64,
}

impl BuildBench {
    pub fn render(&self) -> String {
        let mut s = String::from("build\n");
        s.push_str(&format!(
            "  cold 6-step build        {:>8.2} s   podman build {}\n",
            self.cold_secs,
            self.podman_cold_secs.map_or("n/a".to_string(), |p| format!(
                "{p:.2} s ({:.2}x)",
                self.cold_secs / p
            ))
        ));
        s.push_str(&format!(
            "  cached rebuild           {:>8.3} s   ({} steps run)\n",
            self.cached_secs, self.cached_steps_run
        ));
        s.push_str(&format!(
            "  {} task images on disk  {:>8.1} MB   base + changes {:.1} MB ({:.3}x)\n",
            self.tasks,
            self.tasks_disk_bytes as f64 / 1e6,
            self.base_plus_changes_bytes as f64 / 1e6,
            self.ratio()
        ));
        s
    }

    pub fn ratio(&self) -> f64 {
        self.tasks_disk_bytes as f64 / self.base_plus_changes_bytes.max(1) as f64
    }
}

const DOCKERFILE: &str = r#"ARG BASE=default
FROM ${BASE}
COPY pkg/ /tmp/pkg/
RUN dpkg -i /tmp/pkg/warren-bench-tool_1.0_all.deb && warren-bench-tool
COPY index/ /tmp/index/
RUN (python3 -m http.server --bind 127.0.0.1 --directory /tmp/index 8765 >/dev/null 2>&1 & echo $! > /tmp/index.pid) \
 && until python3 -c "import socket; socket.create_connection(('127.0.0.1', 8765))" 2>/dev/null; do sleep 0.05; done \
 && python3 "$(echo /tmp/index/pip/pip-*.whl)/pip" install --no-cache-dir --index-url http://127.0.0.1:8765/simple/ --break-system-packages --disable-pip-version-check -q benchpkg \
 && kill "$(cat /tmp/index.pid)" && rm /tmp/index.pid && python3 -c "import benchpkg; print(benchpkg.VALUE)"
COPY app/ /app/
RUN python3 -m compileall -q /app && echo built > /app/built
"#;

fn sh(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// pip's own wheel, from the host's Python (`python3-pip-whl`, which `python3-venv` needs).
fn pip_wheel() -> Option<PathBuf> {
    std::fs::read_dir("/usr/share/python-wheels")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("pip-") && n.ends_with(".whl"))
        })
}

/// The context: a `.deb` (made with `dpkg-deb`), a wheel, an application directory.
fn make_context(dir: &Path) -> anyhow::Result<()> {
    let deb = dir.join("debroot");
    std::fs::create_dir_all(deb.join("DEBIAN"))?;
    std::fs::create_dir_all(deb.join("usr/local/bin"))?;
    std::fs::write(
        deb.join("DEBIAN/control"),
        "Package: warren-bench-tool\nVersion: 1.0\nArchitecture: all\nMaintainer: bench <bench@localhost>\nDescription: a tool\n",
    )?;
    let tool = deb.join("usr/local/bin/warren-bench-tool");
    std::fs::write(&tool, "#!/bin/sh\necho tool installed\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755))?;
    std::fs::create_dir_all(dir.join("pkg"))?;
    sh(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group"])
            .arg(&deb)
            .arg(dir.join("pkg/warren-bench-tool_1.0_all.deb")),
        "dpkg-deb",
    )?;
    std::fs::remove_dir_all(&deb)?;
    // The index: `simple/` (PEP 503: a page of projects, a page of files per project, each
    // link with its sha256) over `files/`.
    let index = dir.join("index");
    std::fs::create_dir_all(index.join("files"))?;
    std::fs::create_dir_all(index.join("simple/benchpkg"))?;
    let wheel = index.join("files/benchpkg-1.0-py3-none-any.whl");
    sh(
        Command::new("python3").args(["-c", r#"
import sys, zipfile
import base64, hashlib
files = {
    "benchpkg/__init__.py": "VALUE = 42\n",
    "benchpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: benchpkg\nVersion: 1.0\n",
    "benchpkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for path, body in files.items():
        b = body.encode()
        z.writestr(path, b)
        h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, h, len(b)))
    record.append("benchpkg-1.0.dist-info/RECORD,,")
    z.writestr("benchpkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
"#]).arg(&wheel),
        "python3 (making a wheel)",
    )?;
    use sha2::Digest as _;
    let sum = sha2::Sha256::digest(std::fs::read(&wheel)?);
    let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(
        index.join("simple/index.html"),
        "<!DOCTYPE html>\n<html><body><a href=\"benchpkg/\">benchpkg</a></body></html>\n",
    )?;
    std::fs::write(
        index.join("simple/benchpkg/index.html"),
        format!(
            "<!DOCTYPE html>\n<html><body><a href=\"../../files/benchpkg-1.0-py3-none-any.whl#sha256={hex}\">benchpkg-1.0-py3-none-any.whl</a></body></html>\n"
        ),
    )?;
    // pip itself, outside the index (the base has none): the host's copy.
    let pip = pip_wheel().context(
        "no pip wheel in /usr/share/python-wheels (scripts/setup-test.sh installs python3-venv)",
    )?;
    std::fs::create_dir_all(index.join("pip"))?;
    std::fs::copy(
        &pip,
        index.join("pip").join(pip.file_name().unwrap_or_default()),
    )?;
    for i in 0..20 {
        let d = dir.join(format!("app/mod{i}"));
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("__init__.py"), format!("N = {i}\n"))?;
    }
    std::fs::write(dir.join("Dockerfile"), DOCKERFILE)?;
    Ok(())
}

async fn build(
    s: &Setup,
    ctx: &Path,
    tag: &str,
    no_cache: bool,
) -> anyhow::Result<(f64, usize, Vec<String>)> {
    let t = Instant::now();
    let opts = BuildOptions {
        tag: tag.to_string(),
        no_cache,
        build_args: [("BASE".to_string(), s.image.clone())].into(),
        ..Default::default()
    };
    let tar = warren_client::pack_dir(ctx);
    let stream = s
        .client
        .build_image(tokio_util::io::StreamReader::new(tar), &opts)
        .await?;
    let mut run = 0;
    let image = stream
        .finish(|ev| {
            if let BuildEvent::Result { steps_run, .. } = ev {
                run = *steps_run;
            }
        })
        .await
        .with_context(|| format!("building {tag}"))?;
    Ok((
        t.elapsed().as_secs_f64(),
        run,
        image.layers.into_iter().map(|l| l.digest).collect(),
    ))
}

/// `podman build --no-cache` of `ctx` over the node's base image (imported into podman from
/// a tar of its one layer); `None` when podman is not installed.
fn podman_build(
    store: &Path,
    base_layers: &[String],
    ctx: &Path,
    scratch: &Path,
) -> anyhow::Result<Option<f64>> {
    if Command::new("podman").arg("--version").output().is_err() {
        return Ok(None);
    }
    anyhow::ensure!(
        base_layers.len() == 1,
        "the podman half needs a one-layer base image (this one has {})",
        base_layers.len()
    );
    let hex = base_layers[0].trim_start_matches("sha256:");
    let mnt = store.join("mnt").join(hex);
    anyhow::ensure!(
        mnt.join("etc").is_dir(),
        "the base layer is not mounted at {} (start a sandbox of it first)",
        mnt.display()
    );
    let tar = scratch.join("base.tar");
    sh(
        Command::new("tar")
            .args(["--numeric-owner", "--xattrs", "-C"])
            .arg(&mnt)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
        "tar of the base",
    )?;
    let base = "localhost/warren-bench-base:latest";
    sh(
        Command::new("podman").arg("import").arg(&tar).arg(base),
        "podman import",
    )?;
    let _ = std::fs::remove_file(&tar);
    let t = Instant::now();
    sh(
        Command::new("podman")
            .args([
                "build",
                "--runtime",
                "runc",
                "--ulimit",
                "nofile=1024:1024",
                "--network",
                "none",
                "--no-cache",
                "-q",
                "-t",
                "localhost/warren-bench-built:latest",
                "--build-arg",
                &format!("BASE={base}"),
            ])
            .arg(ctx),
        "podman build",
    )?;
    let secs = t.elapsed().as_secs_f64();
    let _ = Command::new("podman")
        .args(["rmi", "-f", "localhost/warren-bench-built:latest", base])
        .output();
    Ok(Some(secs))
}

fn layer_bytes(store: &Path, digest: &str) -> u64 {
    std::fs::metadata(
        store
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .map_or(0, |m| m.len())
}

pub async fn build_bench(s: &Setup, store: &Path, tasks: usize) -> anyhow::Result<BuildBench> {
    let scratch = tempfile::Builder::new()
        .prefix("warren-bench-build-")
        .tempdir()?;
    let ctx = scratch.path().join("ctx");
    std::fs::create_dir_all(&ctx)?;
    make_context(&ctx)?;
    let tag = format!("bench-build-{}:1", s.run_id);
    if s.progress {
        eprintln!("build: cold build of a 6-step Dockerfile");
    }
    let (cold, _, _) = build(s, &ctx, &tag, true).await?;
    let (cached, cached_run, _) = build(s, &ctx, &tag, false).await?;
    let base = s.client.image(&s.image).await?;
    let base_layers: Vec<String> = base.layers.iter().map(|l| l.digest.clone()).collect();
    if s.progress {
        eprintln!("build: podman build of the same file");
    }
    let podman = podman_build(store, &base_layers, &ctx, scratch.path())?;
    // 100 task images from one base.
    if s.progress {
        eprintln!("build: {tasks} task images");
    }
    let mut all = BTreeSet::new();
    let mut own = 0u64;
    let mut made = Vec::new();
    for i in 0..tasks {
        let t = scratch.path().join(format!("task{i}"));
        std::fs::create_dir_all(t.join("files"))?;
        std::fs::write(
            t.join("Dockerfile"),
            "ARG BASE=default\nFROM ${BASE}\nCOPY files/ /task/\nRUN echo $((6 * 7)) > /task/answer\n",
        )?;
        std::fs::write(t.join("files/task.json"), format!("{{\"task\": {i}}}\n"))?;
        std::fs::write(
            t.join("files/test.sh"),
            format!("#!/bin/sh\ntest \"$(cat /task/answer)\" = 42 # {i}\n"),
        )?;
        let tag = format!("bench-task-{}-{i}:1", s.run_id);
        let (_, _, layers) = build(s, &t, &tag, false).await?;
        for l in &layers {
            if !base_layers.contains(l) {
                own += layer_bytes(store, l);
            }
            all.insert(l.clone());
        }
        made.push(tag);
    }
    let tasks_disk_bytes: u64 = all.iter().map(|l| layer_bytes(store, l)).sum();
    let base_bytes: u64 = base_layers.iter().map(|l| layer_bytes(store, l)).sum();
    for t in made.iter().chain(std::iter::once(&tag)) {
        let _ = s.client.delete_image(t).await;
    }
    Ok(BuildBench {
        cold_secs: cold,
        podman_cold_secs: podman,
        cached_secs: cached,
        cached_steps_run: cached_run,
        tasks,
        tasks_disk_bytes,
        base_plus_changes_bytes: base_bytes + own,
    })
}

/// The node's layer store (`--store`, else `WARREN_IMAGE_STORE`, else the default).
pub fn store_dir(arg: Option<&Path>) -> PathBuf {
    arg.map(Path::to_path_buf)
        .or_else(|| std::env::var_os("WARREN_IMAGE_STORE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren/images"))
}
