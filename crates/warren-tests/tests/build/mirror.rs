//! Package installs of the kinds task Dockerfiles do, from indexes this test serves itself:
//! `apt-get install` from a Debian repository of `.deb`s made here with `dpkg-deb`, and
//! `pip install` from a simple index of wheels made here (pip itself comes from the same
//! index: the base has none). The mirror is a host this test creates in a network namespace
//! of its own (`ip netns add`, a veth pair with addresses `10.254.S.1`/`.2` for a slot `S`
//! this process holds a lock on, the slots shared with the network tests), named in the
//! daemon's network configuration as a service; a build's `RUN` reaches exactly the node's
//! configured services, and nothing with `--network none`.

use super::{build, write};
use crate::common::netslot::{must, run, take_slot, Slot};
use crate::common::{self, Daemon};
use crate::layers;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The mirror host: a network namespace serving `root` over HTTP on port 8080.
struct Mirror {
    slot: Slot,
    ns: String,
    veth: String,
    server: Option<Child>,
}

impl Mirror {
    fn ip(&self) -> String {
        format!("10.254.{}.2", self.slot.n)
    }

    fn start(root: &Path) -> Mirror {
        let slot = take_slot();
        let s = slot.n;
        let (ns, veth) = (format!("wtnet{s}"), format!("wtm{s}"));
        // Leftovers of a killed earlier run of this slot.
        let _ = run("ip", &["netns", "del", &ns]);
        let _ = run("ip", &["link", "del", &veth]);
        let mut m = Mirror {
            slot,
            ns,
            veth,
            server: None,
        };
        let (ns, veth) = (m.ns.clone(), m.veth.clone());
        must("ip", &["netns", "add", &ns]);
        must(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", "m0", "netns", &ns,
            ],
        );
        must(
            "ip",
            &["addr", "add", &format!("10.254.{s}.1/24"), "dev", &veth],
        );
        must("ip", &["link", "set", &veth, "up"]);
        let mirror_cidr = format!("10.254.{s}.2/24");
        must("ip", &["-n", &ns, "addr", "add", &mirror_cidr, "dev", "m0"]);
        must("ip", &["-n", &ns, "link", "set", "m0", "up"]);
        must("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        let gw = format!("10.254.{s}.1");
        must("ip", &["-n", &ns, "route", "add", "default", "via", &gw]);
        let log = File::create(root.with_extension("log")).unwrap();
        m.server = Some(
            Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-m", "http.server"])
                .args(["8080", "--bind", "0.0.0.0", "--directory"])
                .arg(root)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("starting the mirror's HTTP server"),
        );
        let addr: std::net::SocketAddr = format!("{}:8080", m.ip()).parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the mirror did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// The daemon's network configuration: the mirror is service `mirror`, under two names.
    fn network_config(&self) -> String {
        let (s, ip) = (self.slot.n, self.ip());
        format!(
            r#"pool = "10.201.{s}.0/24"
[services.mirror]
cidrs = ["{ip}/32"]
ports = [8080]
protocol = "tcp"
hostnames = ["deb.mirror.test", "pypi.mirror.test"]
[hosts]
"deb.mirror.test" = ["{ip}"]
"pypi.mirror.test" = ["{ip}"]
"#
        )
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = run("ip", &["netns", "del", &self.ns]);
        let _ = run("ip", &["link", "del", &self.veth]);
    }
}

/// Writes the served tree under `root`: `debs/` (a flat apt repository: two packages, one
/// depending on the other, `Packages` and `Release`), `simple/` (a PEP 503 index of two
/// wheels, one requiring the other) and `files/` (the wheels, and pip's own wheel).
fn make_indexes(root: &Path, scratch: &Path, pip_wheel: &Path) {
    let debs = root.join("debs");
    std::fs::create_dir_all(&debs).unwrap();
    for (pkg, depends, file, body) in [
        ("task-lib", "", "usr/share/task-lib/data.txt", "task data\n"),
        (
            "task-tool",
            "Depends: task-lib\n",
            "usr/bin/task-tool",
            "#!/bin/sh\necho \"task tool: $(cat /usr/share/task-lib/data.txt)\"\n",
        ),
    ] {
        let dir = scratch.join(pkg);
        write(
            &dir,
            "DEBIAN/control",
            &format!(
                "Package: {pkg}\nVersion: 1.0\nArchitecture: all\n{depends}Maintainer: tests <tests@localhost>\nDescription: a package of the build tests\n"
            ),
        );
        write(&dir, file, body);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = debs.join(format!("{pkg}_1.0_all.deb"));
        must(
            "dpkg-deb",
            &[
                "--build",
                "--root-owner-group",
                dir.to_str().unwrap(),
                out.to_str().unwrap(),
            ],
        );
    }
    std::fs::create_dir_all(root.join("files")).unwrap();
    std::fs::copy(
        pip_wheel,
        root.join("files").join(pip_wheel.file_name().unwrap()),
    )
    .unwrap();
    let script = scratch.join("indexes.py");
    std::fs::write(&script, INDEXES).unwrap();
    let st = Command::new("python3")
        .arg(&script)
        .arg(root)
        .status()
        .unwrap();
    assert!(st.success(), "writing the indexes");
}

/// Writes `Packages` and `Release` of `debs/` (from each .deb's control file) and the wheels
/// with their simple index. Paths and hashes as apt and pip read them.
const INDEXES: &str = r#"
import base64, email.utils, hashlib, os, subprocess, sys, zipfile
root = sys.argv[1]
debs = os.path.join(root, "debs")
entries = []
for name in sorted(os.listdir(debs)):
    if not name.endswith(".deb"): continue
    p = os.path.join(debs, name)
    data = open(p, "rb").read()
    control = subprocess.run(["dpkg-deb", "-f", p], check=True, capture_output=True, text=True).stdout.strip()
    entries.append("%s\nFilename: ./%s\nSize: %d\nSHA256: %s\n" % (control, name, len(data), hashlib.sha256(data).hexdigest()))
packages = "\n".join(entries).encode()
open(os.path.join(debs, "Packages"), "wb").write(packages)
open(os.path.join(debs, "Release"), "w").write(
    "Origin: tests\nLabel: tests\nDate: %s\nSHA256:\n %s %d Packages\n"
    % (email.utils.formatdate(usegmt=True), hashlib.sha256(packages).hexdigest(), len(packages)))

files = os.path.join(root, "files")
os.makedirs(files, exist_ok=True)
def wheel(name, version, requires):
    fn = "%s-%s-py3-none-any.whl" % (name, version)
    di = "%s-%s.dist-info" % (name, version)
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    for r in requires: meta += "Requires-Dist: %s\n" % r
    content = {di + "/METADATA": meta,
               di + "/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    content.update(MODULES[name])
    record = []
    with zipfile.ZipFile(os.path.join(files, fn), "w") as z:
        for path, body in content.items():
            b = body.encode()
            z.writestr(path, b)
            h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (path, h, len(b)))
        record.append(di + "/RECORD,,")
        z.writestr(di + "/RECORD", "\n".join(record) + "\n")
    return fn
MODULES = {
    "taskdep": {"taskdep/__init__.py": "BASE = 40\n"},
    "taskpkg": {"taskpkg/__init__.py": "from taskdep import BASE\nVALUE = BASE + 2\n"},
}
wheels = {"taskdep": wheel("taskdep", "1.0", []), "taskpkg": wheel("taskpkg", "1.0", ["taskdep"])}
os.makedirs(os.path.join(root, "simple"))
links = []
for name, fn in wheels.items():
    d = os.path.join(root, "simple", name)
    os.makedirs(d)
    h = hashlib.sha256(open(os.path.join(files, fn), "rb").read()).hexdigest()
    open(os.path.join(d, "index.html"), "w").write(
        '<!DOCTYPE html><html><body><a href="../../files/%s#sha256=%s">%s</a></body></html>\n' % (fn, h, fn))
    links.append('<a href="%s/">%s</a>' % (name, name))
open(os.path.join(root, "simple", "index.html"), "w").write(
    "<!DOCTYPE html><html><body>%s</body></html>\n" % "".join(links))
"#;

/// pip's own wheel, from the host's Python (`python3-venv` ships it; scripts/setup-test.sh
/// installs that).
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

const DOCKERFILE: &str = r#"FROM default
ARG DEB_MIRROR=http://deb.mirror.test:8080/debs
RUN echo "deb [trusted=yes] $DEB_MIRROR ./" > /etc/apt/sources.list \
 && rm -rf /etc/apt/sources.list.d/* \
 && apt-get update && apt-get install -y --no-install-recommends task-tool \
 && rm -rf /var/lib/apt/lists/*
ARG PIP_WHEEL
RUN python3 -c "import urllib.request as u; u.urlretrieve('http://pypi.mirror.test:8080/files/$PIP_WHEEL', '/tmp/$PIP_WHEEL')" \
 && python3 /tmp/$PIP_WHEEL/pip install --no-cache-dir --break-system-packages --disable-pip-version-check \
      --index-url http://pypi.mirror.test:8080/simple/ --trusted-host pypi.mirror.test taskpkg \
 && rm /tmp/$PIP_WHEEL
CMD ["task-tool"]
"#;

/// `apt-get install` and `pip install` in a build's `RUN`s, from the test's own mirror: the
/// packages and their dependencies are in the image; with `--network none` the same build
/// cannot reach the mirror and fails at its first `RUN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apt_get_and_pip_install_from_served_indexes() {
    if common::should_skip() {
        return;
    }
    for tool in ["ip", "nft", "python3", "dpkg-deb"] {
        if !run("sh", &["-c", &format!("command -v {tool}")]).0 {
            common::skip(format!(
                "{tool} is not installed (scripts/setup.sh installs it)"
            ));
            return;
        }
    }
    let Some(pip) = pip_wheel() else {
        common::skip("no pip wheel in /usr/share/python-wheels (scripts/setup-test.sh installs python3-venv)");
        return;
    };
    let t = layers::scratch("build-mirror");
    let root = t.path().join("served");
    make_indexes(&root, &t.path().join("work"), &pip);
    let mirror = Mirror::start(&root);
    let config = mirror.network_config();
    let Some(d) = Daemon::start_with(|dir| {
        let p = dir.join("network.toml");
        std::fs::write(&p, &config).unwrap();
        vec!["--network-config".into(), p.display().to_string()]
    })
    .await
    else {
        return;
    };
    let ctx = t.path().join("ctx");
    write(&ctx, "Dockerfile", DOCKERFILE);
    let tag = format!("{}:1", super::unique("installs"));
    let pip_arg = format!("PIP_WHEEL={}", pip.file_name().unwrap().to_str().unwrap());
    let ctx_s = ctx.to_str().unwrap();
    let (code, out, err) = build(&d, &[ctx_s, "-t", &tag, "--build-arg", &pip_arg]);
    assert_eq!(code, 0, "build failed: {out}{err}");
    let id = d.create(&super::image(&tag)).await.id;
    let seen = d
        .sh_ok(
            &id,
            "task-tool; dpkg-query -W -f '${Package} ${Status}\\n' task-lib task-tool; \
             python3 -c 'import taskpkg, taskdep; print(taskpkg.VALUE)'; \
             ls /var/lib/apt/lists | grep -c mirror || true",
        )
        .await;
    assert_eq!(
        seen,
        "task tool: task data\ntask-lib install ok installed\ntask-tool install ok installed\n42\n0\n"
    );
    d.client().delete(&id).await.unwrap();

    // No network: the first RUN cannot reach the mirror; nothing is tagged.
    let tag2 = format!("{}:1", super::unique("offline"));
    let (code, out, err) = build(
        &d,
        &[
            ctx_s,
            "-t",
            &tag2,
            "--build-arg",
            &pip_arg,
            "--network",
            "none",
            "--no-cache",
        ],
    );
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("Step 3/"), "{err}");
    assert!(d.client().image(&tag2).await.is_err());
    assert!(d.list().await.is_empty(), "no sandbox is left");
    d.client().delete_image(&tag).await.unwrap();
    drop(mirror);
}
