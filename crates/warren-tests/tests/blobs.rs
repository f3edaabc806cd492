//! Remote layers through a real daemon: a sandbox starts from a layer that exists only in an
//! HTTP blob store (lazy, over the FUSE file) and reads it correctly; a corrupt chunk is an
//! I/O error inside the sandbox; an unreachable blob store fails `create` with a clear error
//! and leaves no sandbox, cgroup or mount behind.

#[path = "common/mod.rs"]
mod common;

use common::{
    bin_dir, ensure_default_image, image_store, node_cgroup_dirs, should_skip, test_root,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use warren_blob::serve::{serve, ServeStats};
use warren_blob::{blob_key, hex_of, publish_layer, LocalStore};
use warren_client::Client;
use warren_image::ImageStore;
use warren_types::{CreateSandboxRequest, ExecRequest, ImageRef};

struct Node {
    name: String,
    dir: PathBuf,
    store: PathBuf,
    child: Child,
    client: Client,
}

impl Node {
    /// A daemon with its own image store (holding only `default`, linked) and `blob_args`.
    async fn start(tag: &str, blob_args: &[String]) -> Node {
        let name = format!("blob{tag}{}", std::process::id() % 100_000);
        let dir = test_root().join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = ImageStore::open(image_store()).unwrap();
        let m = src.manifest("default").unwrap();
        let store = dir.join("store");
        let dst = ImageStore::open(&store).unwrap();
        for l in &m.layers {
            std::os::unix::fs::symlink(src.blob_path(l).unwrap(), dst.blob_path(l).unwrap())
                .unwrap();
        }
        dst.put_manifest(&m).unwrap();
        let sock = dir.join("warrend.sock");
        let log = std::fs::File::create(dir.join("warrend.log")).unwrap();
        let child = Command::new(bin_dir().join("warrend"))
            .arg("--socket")
            .arg(&sock)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--image-store")
            .arg(&store)
            .args(["--node", &name])
            .args(blob_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let client = Client::new(&format!("unix://{}", sock.display())).unwrap();
        let mut node = Node {
            name,
            dir,
            store,
            child,
            client,
        };
        for _ in 0..300 {
            if node.client.health().await.is_ok() {
                return node;
            }
            if let Ok(Some(s)) = node.child.try_wait() {
                panic!("warrend exited: {s}: {}", node.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        node.stop();
        panic!("warrend did not start: {}", node.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("warrend.log")).unwrap_or_default()
    }

    /// Unmounts the layers, stops the daemon, removes its directory.
    fn stop(&mut self) {
        let left = ImageStore::open(&self.store).unwrap().unmount_all();
        assert!(left.is_empty(), "mounts left: {left:?}");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A test that failed before `stop`: the daemon and its mounts go anyway (no assertion here,
/// the test has failed already).
impl Drop for Node {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // TERM first: the daemon removes its sandboxes.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .status();
            for _ in 0..100 {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            if let Ok(s) = ImageStore::open(&self.store) {
                let _ = s.unmount_all();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

async fn blob_server(dir: &Path) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(serve(
        l,
        dir.to_path_buf(),
        0,
        Arc::new(ServeStats::default()),
    ));
    url
}

/// A layer with `/remote/hello.txt` and a 3 MiB `/remote/big.bin`, published to `served`.
async fn publish(work: &Path, served: &Path) -> (String, Vec<u8>) {
    let tree = work.join("tree/remote");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("hello.txt"), "hello from a remote layer\n").unwrap();
    let big: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(tree.join("big.bin"), &big).unwrap();
    let img = work.join("layer.erofs");
    let ok = Command::new("mkfs.erofs")
        .args(["--quiet", "-T0", "--all-root"])
        .arg(&img)
        .arg(work.join("tree"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfs.erofs");
    let t = publish_layer(&LocalStore::new(served), &img, 256 * 1024)
        .await
        .unwrap();
    (t.digest, big)
}

fn stack(digest: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        image: ImageRef::Stack(vec!["default".into(), digest.to_string()]),
        ..Default::default()
    }
}

async fn sh(c: &Client, id: &str, cmd: &str) -> warren_types::ExecResult {
    c.exec(
        id,
        &ExecRequest {
            shell: Some(cmd.into()),
            timeout_secs: Some(60.0),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_starts_from_a_remote_only_layer_and_corrupt_chunks_are_io_errors() {
    if should_skip() {
        return;
    }
    ensure_default_image();
    let work = tempfile_dir("remote");
    let served = work.join("served");
    let (digest, big) = publish(&work, &served).await;
    let url = blob_server(&served).await;
    let mut node = Node::start(
        "l",
        &[
            "--blob-store".into(),
            url.clone(),
            "--blob-mode".into(),
            "lazy".into(),
        ],
    )
    .await;
    let r = async {
        assert!(!ImageStore::open(&node.store)
            .unwrap()
            .blob_path(&digest)
            .unwrap()
            .exists());
        let sb = node.client.create(&stack(&digest)).await.expect("create");
        let id = sb.id.as_str();
        let out = sh(&node.client, id, "cat /remote/hello.txt").await;
        assert_eq!(out.stdout, "hello from a remote layer\n", "{out:?}");
        let out = sh(&node.client, id, "sha256sum /remote/big.bin | cut -c1-64").await;
        assert_eq!(
            out.stdout.trim(),
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&big))
        );
        node.client.delete(id).await.unwrap();

        // Corrupt the server's copy of the chunks holding most of big.bin; a fresh node
        // (empty cache) must refuse them: the sandbox sees EIO, never the wrong bytes.
        let blob = served.join(blob_key(hex_of(&digest).unwrap()));
        let mut bytes = std::fs::read(&blob).unwrap();
        let n = bytes.len();
        for b in &mut bytes[n / 3..n * 2 / 3] {
            *b ^= 0x5a;
        }
        std::fs::write(&blob, &bytes).unwrap();
        let mut fresh = Node::start(
            "c",
            &[
                "--blob-store".into(),
                url.clone(),
                "--blob-mode".into(),
                "lazy".into(),
            ],
        )
        .await;
        let r = async {
            let sb = fresh.client.create(&stack(&digest)).await.expect("create");
            let out = sh(
                &fresh.client,
                sb.id.as_str(),
                "cat /remote/big.bin > /dev/null",
            )
            .await;
            assert_ne!(out.exit_code, Some(0), "{out:?}");
            assert!(out.stderr.contains("Input/output error"), "{out:?}");
            fresh.client.delete(sb.id.as_str()).await.unwrap();
            assert!(fresh.log().contains("refusing a corrupt chunk"));
        }
        .await;
        fresh.stop();
        r
    }
    .await;
    node.stop();
    let _ = std::fs::remove_dir_all(&work);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_blob_store_fails_create_cleanly() {
    if should_skip() {
        return;
    }
    ensure_default_image();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut node = Node::start(
        "u",
        &["--blob-store".into(), format!("http://127.0.0.1:{port}")],
    )
    .await;
    let digest = format!("sha256:{}", "ab".repeat(32));
    let err = node.client.create(&stack(&digest)).await.unwrap_err();
    let msg = err.to_string();
    let code = match &err {
        warren_client::ClientError::Api { error, .. } => Some(error.code),
        _ => None,
    };
    let name = node.name.clone();
    let store = node.store.clone();
    let listed = node.client.list(&Default::default(), None).await;
    node.stop();
    assert!(msg.contains("unreachable"), "{msg}");
    assert_eq!(code, Some(warren_types::ErrorCode::StartFailed), "{msg}");
    assert!(listed.map(|l| l.is_empty()).unwrap_or(false));
    for d in node_cgroup_dirs(&name) {
        let children = std::fs::read_dir(&d)
            .map(|r| r.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0);
        assert_eq!(children, 0, "sandbox cgroup left in {}", d.display());
    }
    assert!(!store.join("mnt").join("ab".repeat(32)).exists());
}

fn tempfile_dir(tag: &str) -> PathBuf {
    let d = test_root().join(format!("blobs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A tiny `warren bench images` (2 images of 16 MiB, 4 sandboxes per mode): every mode's
/// sandboxes finish and the report has the three modes. No timing is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_images_smoke() {
    if should_skip() {
        return;
    }
    ensure_default_image();
    let warren = bin_dir().join("warren");
    if !warren.is_file() {
        common::skip(format!(
            "{} is missing (cargo build -p warren-cli)",
            warren.display()
        ));
        return;
    }
    let work = tempfile_dir("bench");
    let out = tokio::process::Command::new(&warren)
        .args([
            "bench",
            "images",
            "--json",
            "--img-count",
            "2",
            "--img-mb",
            "16",
        ])
        .args(["--img-sandboxes", "4", "--img-rate-mbps", "200"])
        .arg("--img-served")
        .arg(work.join("served"))
        .arg("--img-work")
        .arg(work.join("node"))
        .env("WARREN_BIN_DIR", bin_dir())
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&work);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let modes: Vec<&str> = report["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["lazy", "eager", "tar"]);
    for m in report["modes"].as_array().unwrap() {
        assert_eq!(m["ok"], 4, "{m}");
    }
}

/// A built image starts lazily on a second node: node A builds it (a `RUN` and a `COPY`),
/// its own layers are published to an HTTP blob store, and node B — which holds only the
/// base — starts a sandbox of the stack from the store over FUSE and sees the build's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_image_starts_lazily_on_a_second_node() {
    if should_skip() {
        return;
    }
    ensure_default_image();
    let work = tempfile_dir("built");
    let ctx = work.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM default\nRUN mkdir /task && echo made by run > /task/run.txt\nCOPY task.txt /task/\n",
    )
    .unwrap();
    std::fs::write(ctx.join("task.txt"), "copied\n").unwrap();
    let mut a = Node::start("ba", &[]).await;
    let sock = a.dir.join("warrend.sock");
    let out = Command::new(bin_dir().join("warren"))
        .arg("--url")
        .arg(format!("unix://{}", sock.display()))
        .args(["image", "build", "-q", "-t", "lazy-built:1"])
        .arg(&ctx)
        .output()
        .unwrap();
    let built = async {
        assert!(
            out.status.success(),
            "build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let base = a.client.image("default").await.unwrap().layers.len();
        let layers: Vec<String> = a
            .client
            .image("lazy-built:1")
            .await
            .unwrap()
            .layers
            .into_iter()
            .map(|l| l.digest)
            .collect();
        assert_eq!(layers.len(), base + 2);
        let store = ImageStore::open(&a.store).unwrap();
        let served = work.join("served");
        let mut own = Vec::new();
        for l in &layers[base..] {
            let t = publish_layer(
                &LocalStore::new(&served),
                &store.blob_path(l).unwrap(),
                256 * 1024,
            )
            .await
            .unwrap();
            assert_eq!(&t.digest, l, "a layer is published under its own digest");
            own.push(t.digest);
        }
        (served, own)
    }
    .await;
    a.stop();
    let (served, own) = built;
    let url = blob_server(&served).await;
    let mut b = Node::start(
        "bb",
        &[
            "--blob-store".into(),
            url,
            "--blob-mode".into(),
            "lazy".into(),
        ],
    )
    .await;
    let r = async {
        let bstore = ImageStore::open(&b.store).unwrap();
        for l in &own {
            assert!(
                !bstore.blob_path(l).unwrap().exists(),
                "B has no copy of {l}"
            );
        }
        let mut refs = vec!["default".to_string()];
        refs.extend(own.iter().cloned());
        let sb = b
            .client
            .create(&CreateSandboxRequest {
                image: ImageRef::Stack(refs),
                ..Default::default()
            })
            .await
            .expect("create on B");
        let out = sh(
            &b.client,
            sb.id.as_str(),
            "cat /task/run.txt /task/task.txt",
        )
        .await;
        assert_eq!(out.stdout, "made by run\ncopied\n", "{out:?}");
        b.client.delete(sb.id.as_str()).await.unwrap();
    }
    .await;
    b.stop();
    let _ = std::fs::remove_dir_all(&work);
    r
}
