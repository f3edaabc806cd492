//! `FROM` a registry image: a registry this test serves on loopback (Debian's
//! `docker-registry`, the CNCF distribution registry) holds a small image podman pushed
//! (a static busybox as its shell, with an `ENV` and a `WORKDIR`); the build pulls it as
//! `image import --registry` does, keeps its configuration, runs a `RUN` over it, and a
//! second build uses the pulled copy. Without `--insecure` the plain-HTTP registry is an
//! error naming the reference; a bare name that is no image says how to name a registry.

use super::{build, podman, result_of, write};
use crate::common::{self, Daemon};
use crate::layers;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const REGISTRY: &str = "/usr/bin/docker-registry";

struct Registry {
    child: Child,
    port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry(dir: &std::path::Path) -> Registry {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new(REGISTRY)
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
        .spawn()
        .expect("starting docker-registry");
    let r = Registry { child, port };
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "docker-registry did not listen: {}",
            std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_a_registry_image_pulls_it_once() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    for (tool, what) in [
        ("podman", "podman"),
        (REGISTRY, "docker-registry"),
        ("/bin/busybox", "busybox-static"),
    ] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .status()
            .is_ok_and(|s| s.success())
        {
            common::skip(format!(
                "{what} is not installed (scripts/setup-test.sh installs it)"
            ));
            return;
        }
    }
    let t = layers::scratch("build-registry");
    let reg = start_registry(t.path());
    // The image: busybox as /bin/sh, pushed by podman.
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "echo", "pwd", "true"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let tar = t.path().join("root.tar");
    let st = Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let remote = format!("127.0.0.1:{}/tests/tiny:1", reg.port);
    let local = format!("localhost/warren-test-tiny-{}:1", std::process::id());
    let (ok, o) = podman(&[
        "import",
        "--change",
        "ENV TINY=yes",
        "--change",
        "WORKDIR /tmp",
        tar.to_str().unwrap(),
        &local,
    ]);
    assert!(ok, "podman import: {o}");
    let (ok, o) = podman(&["push", "--tls-verify=false", &local, &remote]);
    let _ = podman(&["rmi", "-f", &local]);
    assert!(ok, "podman push: {o}");

    let ctx = t.path().join("ctx");
    write(
        &ctx,
        "Dockerfile",
        &format!("FROM {remote}\nRUN echo \"$TINY in $(pwd)\" > /made\nCMD [\"cat\", \"/made\"]\n"),
    );
    let ctx_s = ctx.to_str().unwrap();
    let tag = format!("{}:1", super::unique("from-registry"));
    // Copies pulled by other runs of this test (other ports, other names) on the same store.
    let pulled_names = || async {
        d.client()
            .images()
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.reference)
            .filter(|r| r.starts_with("pulled-tests-tiny-"))
            .collect::<std::collections::BTreeSet<String>>()
    };
    let before = pulled_names().await;
    // Plain HTTP only when asked.
    let (code, _, err) = build(&d, &[ctx_s, "-t", &tag]);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("FROM {remote}")), "{err}");

    let (code, out, err) = build(&d, &[ctx_s, "-t", &tag, "--insecure", "--json"]);
    assert_eq!(code, 0, "build failed: {out}{err}");
    let r = result_of(&out);
    assert_eq!(r["steps_run"], 1, "{r}");
    let c = d.client().image(&tag).await.unwrap().config.unwrap();
    assert!(c.env.contains(&"TINY=yes".to_string()), "{c:?}");
    let id = d.create(&super::image(&tag)).await.id;
    assert_eq!(d.sh_ok(&id, "cat /made; pwd").await, "yes in /tmp\n/tmp\n");
    d.client().delete(&id).await.unwrap();

    // The pulled copy serves the next build, even with the registry gone.
    drop(reg);
    let (code, out, err) = build(&d, &[ctx_s, "-t", &tag, "--insecure", "--json"]);
    assert_eq!(code, 0, "rebuild failed: {out}{err}");
    assert_eq!(result_of(&out)["steps_run"], 0);
    d.client().delete_image(&tag).await.unwrap();
    let pulled: Vec<String> = pulled_names().await.difference(&before).cloned().collect();
    assert_eq!(pulled.len(), 1, "one pulled copy: {pulled:?}");
    d.client().delete_image(&pulled[0]).await.unwrap();

    // A bare name that is no image of the node: how to name a registry image.
    write(&ctx, "Dockerfile", "FROM python:3.11-slim\nRUN true\n");
    let (code, _, err) = build(&d, &[ctx_s, "-t", &tag]);
    assert_eq!(code, 1);
    assert!(err.contains("docker.io/library/python:3.11-slim"), "{err}");
}
