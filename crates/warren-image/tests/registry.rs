//! Import from a real OCI registry: Debian's `docker-registry` (the CNCF distribution
//! registry) on a loopback port, the image pushed with `oci-client`.

mod common;

use common::*;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::{Client, Reference};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_image::import::registry::{import_registry, RegistryOptions};
use warren_image::{ImageError, ImageStore};

const REGISTRY: &str = "/usr/bin/docker-registry";

struct Registry {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_registry() -> Registry {
    let dir = scratch("registry");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new(REGISTRY)
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let mut reg = Registry {
        child,
        port,
        _dir: dir,
    };
    let started = Instant::now();
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return reg;
        }
        if let Some(st) = reg.child.try_wait().unwrap() {
            panic!(
                "docker-registry exited with {st}: {}",
                std::fs::read_to_string(reg._dir.path().join("log")).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "docker-registry did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn push(port: u16, repo: &str, img: &OciImage) {
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let r: Reference = format!("127.0.0.1:{port}/{repo}").parse().unwrap();
    for (d, data) in &img.blobs {
        client.push_blob(&r, data.clone(), d).await.unwrap();
    }
    client
        .push_manifest_raw(
            &r,
            img.manifest.clone(),
            "application/vnd.oci.image.manifest.v1+json"
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_import_round_trip() {
    if should_skip() {
        return;
    }
    if !std::path::Path::new(REGISTRY).is_file() {
        skip(format!(
            "{REGISTRY} is not installed (scripts/setup.sh installs docker-registry)"
        ));
        return;
    }
    let reg = start_registry().await;
    let t = scratch("reg");
    let src = t.path().join("src");
    rich_tree(&src);
    let layer = t.path().join("layer.tar");
    tar_dir(&src, &layer);
    let raw = std::fs::read(&layer).unwrap();
    let wh = tar_entries(&[(".wh.plain.txt", ""), ("extra", "e")]);
    let img = oci_image(&[OciLayer::gzip(raw), OciLayer::zstd(wh)]);
    push(reg.port, "test/rich:1", &img).await;

    let store = Arc::new(ImageStore::open(t.path().join("store")).unwrap());
    let opts = RegistryOptions {
        insecure: true,
        credentials: None,
        owner: None,
        replace: false,
    };
    let reference = format!("127.0.0.1:{}/test/rich:1", reg.port);
    let r = import_registry(store.clone(), &reference, "reg:1", &opts)
        .await
        .unwrap();
    assert_eq!(r.image.layers.len(), 2);
    assert_eq!((r.converted, r.reused), (2, 0));
    assert!(r.image.source.starts_with("registry:"));
    let m = store.manifest("reg:1").unwrap();
    let mounted = Mounted::new(&store.blob_path(&m.layers[0]).unwrap());
    assert_eq!(describe(mounted.path()), describe(&src));
    drop(mounted);
    let top = Mounted::new(&store.blob_path(&m.layers[1]).unwrap());
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(top.path().join("plain.txt"))
        .unwrap()
        .file_type()
        .is_char_device());
    drop(top);

    // Pulled again (by digest this time): no layer is fetched or converted twice.
    let by_digest = format!("127.0.0.1:{}/test/rich@{}", reg.port, img.manifest_digest);
    let again = import_registry(store.clone(), &by_digest, "reg:2", &opts)
        .await
        .unwrap();
    assert_eq!((again.converted, again.reused, again.bytes_read), (0, 2, 0));

    // A tag that exists is refused unless replacing is asked for; the image stays as it was.
    let e = import_registry(store.clone(), &by_digest, "reg:1", &opts)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ImageError::Exists(ref r) if r == "reg:1"),
        "{e}"
    );
    assert_eq!(e.code(), warren_types::ErrorCode::Conflict);
    // The same reference pulled again into its tag, unchanged, replaces nothing: not
    // refused (two daemons sharing a store both pull what a gateway asks for).
    import_registry(store.clone(), &reference, "reg:1", &opts)
        .await
        .unwrap();
    assert_eq!(
        store.manifest("reg:1").unwrap(),
        m,
        "the tag kept what it had"
    );
    let replace = RegistryOptions {
        replace: true,
        ..opts.clone()
    };
    import_registry(store.clone(), &by_digest, "reg:1", &replace)
        .await
        .unwrap();

    // Unknown repositories and tags are clear errors; nothing is tagged.
    let missing = format!("127.0.0.1:{}/test/nope:1", reg.port);
    let e = import_registry(store.clone(), &missing, "nope:1", &opts)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::Registry(_)), "{e}");
    assert!(store.manifest("nope:1").is_err());
    // A registry that does not answer.
    let dead = "127.0.0.1:9/test/rich:1".to_string();
    let e = import_registry(store.clone(), &dead, "dead:1", &opts)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::RegistryUnreachable(_)), "{e}");
    assert_eq!(e.code(), warren_types::ErrorCode::RegistryUnreachable);
    assert!(
        e.to_string()
            .contains("cannot reach the registry 127.0.0.1:9"),
        "{e}"
    );
    assert_eq!(count(&store.root().join("tmp")), 0);
}
