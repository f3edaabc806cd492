//! A Dockerfile built through a gateway: the gateway places the build on a live node, the
//! log streams back through it, the image is usable in a sandbox created through the gateway,
//! the build's layers reach the cluster's blob store and the other node starts from them
//! lazily; a bad Dockerfile gets the same typed error through the gateway as on a node.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use warren_client::{BuildOptions, Client, ClientError, CreateSandboxRequest, ExecRequest};
use warren_image::ImageStore;
use warren_types::{BuildEvent, ImageRef};

use crate::common::{image_store, test_root};
use crate::harness::Cluster;

/// The nodes' own image stores (each holding only `default`, linked to the shared store's
/// blobs) and the blob store they share. Declared before the cluster, it goes after it: the
/// daemons have stopped when their stores' mounts are taken down and the directories removed.
struct Stores {
    dir: PathBuf,
    nodes: Vec<PathBuf>,
}

impl Stores {
    fn new(nodes: usize) -> Stores {
        let dir = test_root().join(format!("cluster-build-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("blobs")).unwrap();
        let src = ImageStore::open(image_store()).unwrap();
        let m = src.manifest("default").unwrap();
        let mut paths = Vec::new();
        for i in 0..nodes {
            let p = dir.join(format!("store{i}"));
            let dst = ImageStore::open(&p).unwrap();
            for l in &m.layers {
                std::os::unix::fs::symlink(src.blob_path(l).unwrap(), dst.blob_path(l).unwrap())
                    .unwrap();
            }
            dst.put_manifest(&m).unwrap();
            paths.push(p);
        }
        Stores { dir, nodes: paths }
    }

    fn blobs(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    fn node_args(&self, i: usize) -> Vec<String> {
        vec![
            "--image-store".into(),
            self.nodes[i].display().to_string(),
            "--blob-store".into(),
            self.blobs().display().to_string(),
            "--blob-mode".into(),
            "lazy".into(),
            // Writable layers where the other test daemons keep theirs.
            "--writable-dir".into(),
            image_store().join("mnt/writable").display().to_string(),
        ]
    }
}

impl Drop for Stores {
    fn drop(&mut self) {
        let mut left = Vec::new();
        for p in &self.nodes {
            if let Ok(s) = ImageStore::open(p) {
                left.extend(s.unmount_all());
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            assert!(left.is_empty(), "layer mounts left: {left:?}");
        }
    }
}

/// A tar of `files` (path, content), as a build context.
fn context(files: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, path, data.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

/// Builds `files` as `tag` through `c`; every event of the log and the outcome.
async fn build(
    c: &Client,
    files: &[(&str, &str)],
    tag: &str,
) -> (
    Vec<BuildEvent>,
    Result<warren_types::ImageInfo, ClientError>,
) {
    let opts = BuildOptions {
        tag: tag.to_string(),
        ..Default::default()
    };
    let ctx = std::io::Cursor::new(context(files));
    let mut events = Vec::new();
    let r = match c.build_image(ctx, &opts).await {
        Ok(s) => s.finish(|e| events.push(e.clone())).await,
        Err(e) => Err(e),
    };
    (events, r)
}

async fn sh(c: &Client, id: &str, cmd: &str) -> String {
    let r = c.exec(id, &ExecRequest::shell(cmd)).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{cmd}: {r:?}");
    r.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_through_a_gateway_runs_on_a_node_and_starts_lazily_on_another() {
    if crate::common::should_skip() {
        return;
    }
    crate::common::ensure_default_image();
    let stores = Stores::new(2);
    let Some(c) = Cluster::start(2, 1, |i| stores.node_args(i)).await else {
        return;
    };
    let gw = c.gw(0);
    let tag = format!("gwbuilt{}:1", std::process::id());
    let files = [
        (
            "Dockerfile",
            "FROM default\nRUN mkdir /task && echo made by run > /task/run.txt && echo ran-in-build\n\
             COPY task.txt /task/\nENV TASK=gateway\nWORKDIR /task\n",
        ),
        ("task.txt", "copied\n"),
    ];
    let (events, built) = build(gw, &files, &tag).await;
    let image = built.unwrap_or_else(|e| panic!("build through the gateway: {e}; {events:?}"));
    // The log came through the gateway as it happened: the steps, the RUN's own output.
    let steps: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            BuildEvent::Step { instruction, .. } => Some(instruction.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        steps.iter().any(|s| s.starts_with("RUN mkdir"))
            && steps.iter().any(|s| s.starts_with("COPY task.txt")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(
            e, BuildEvent::Output { line, .. } if line == "ran-in-build"
        )),
        "the RUN's output in the log: {events:?}"
    );

    // One node built it, and says so in the cluster (placement needs it).
    let name = image.reference.clone();
    let started = Instant::now();
    let builder = loop {
        let holders: Vec<usize> = gw
            .cluster()
            .await
            .unwrap()
            .nodes
            .iter()
            .filter(|n| n.record.images.contains(&name))
            .filter_map(|n| c.nodes.iter().position(|d| d.node == n.id.as_str()))
            .collect();
        if !holders.is_empty() {
            assert_eq!(holders.len(), 1, "one node built {name}");
            break holders[0];
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no node shows {name} in the cluster"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let other = 1 - builder;

    // A sandbox of the image, created through the gateway, runs on the builder with the
    // image's configuration.
    let sb = gw
        .create(&CreateSandboxRequest {
            image: ImageRef::Stack(vec![tag.clone()]),
            memory_mb: Some(64),
            ..Default::default()
        })
        .await
        .expect("a sandbox of the built image through the gateway");
    assert_eq!(c.owner(&sb.id), builder);
    assert_eq!(
        sh(gw, &sb.id, "pwd; echo $TASK; cat run.txt task.txt").await,
        "/task\ngateway\nmade by run\ncopied\n"
    );
    gw.delete(&sb.id).await.unwrap();

    // The build's own layers are in the blob store; the other node has no copy of them and
    // starts a sandbox of the stack from the store, lazily.
    let base = ImageStore::open(&stores.nodes[other])
        .unwrap()
        .manifest("default")
        .unwrap()
        .layers;
    let own: Vec<String> = image
        .layers
        .iter()
        .map(|l| l.digest.clone())
        .filter(|d| !base.contains(d))
        .collect();
    assert!(own.len() >= 2, "a RUN layer and a COPY layer: {image:?}");
    let ostore = ImageStore::open(&stores.nodes[other]).unwrap();
    for l in &own {
        let hex = l.strip_prefix("sha256:").unwrap();
        assert!(
            stores.blobs().join(warren_blob::blob_key(hex)).is_file()
                && stores.blobs().join(warren_blob::chunks_key(hex)).is_file(),
            "{l} was published to the blob store"
        );
        assert!(
            !ostore.blob_path(l).unwrap().exists(),
            "the other node has {l}"
        );
    }
    let mut refs = vec!["default".to_string()];
    refs.extend(own.iter().cloned());
    let on_other = c.nodes[other].client();
    let sb = on_other
        .create(&CreateSandboxRequest {
            image: ImageRef::Stack(refs),
            memory_mb: Some(64),
            ..Default::default()
        })
        .await
        .expect("a sandbox of the built layers on the other node");
    assert_eq!(
        sh(on_other, &sb.id, "cat /task/run.txt /task/task.txt").await,
        "made by run\ncopied\n"
    );
    let stats = on_other.metrics().await.unwrap();
    assert!(lazy_fetches(&stats) > 0, "fetched from the store: {stats}");
    on_other.delete(&sb.id).await.unwrap();
    assert!(
        !ostore.blob_path(&own[0]).unwrap().exists(),
        "lazily: the layer is not copied into the other node's store"
    );

    // A Dockerfile that does not parse: the same typed error through the gateway as on a node.
    let bad = [("Dockerfile", "FROM default\nFROB x\n")];
    let bad_tag = format!("gwbad{}:1", std::process::id());
    let (_, on_node) = build(c.nodes[builder].client(), &bad, &bad_tag).await;
    let (_, through) = build(gw, &bad, &bad_tag).await;
    let (on_node, through) = (api_error(on_node), api_error(through));
    assert_eq!(through, on_node);
    assert!(
        on_node.1.contains("line 2") && on_node.1.contains("FROB"),
        "{on_node:?}"
    );

    gw.delete_image(&tag).await.unwrap();
    drop(c);
    let dir = stores.dir.clone();
    drop(stores);
    assert!(!dir.exists());
}

/// The code, message and status of a failed build.
fn api_error(
    r: Result<warren_types::ImageInfo, ClientError>,
) -> (warren_types::ErrorCode, String, u16) {
    match r {
        Err(ClientError::Api { status, error }) => (error.code, error.message, status),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// `warren_blob_fetches` of a `/metrics` page.
fn lazy_fetches(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("warren_blob_fetches"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}
