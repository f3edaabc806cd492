//! The layer cache against a real HTTP blob server on loopback (and a real FUSE mount and
//! EROFS mount where root).

#[path = "../../../tests/skip.rs"]
mod skip_rule;

use skip_rule::skip;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use warren_blob::serve::{serve, ServeStats};
use warren_blob::{
    blob_key, hex_of, open_store, publish_layer, BlobError, CacheConfig, CacheSource, LayerCache,
    LocalStore, Mode,
};
use warren_image::LayerSource;

struct Env {
    rt: tokio::runtime::Runtime,
    served: tempfile::TempDir,
    cache_dir: tempfile::TempDir,
    url: String,
    stats: Arc<ServeStats>,
}

fn env(rate: u64) -> Env {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = tempfile::tempdir().unwrap();
    let stats = Arc::new(ServeStats::default());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(serve(
        listener,
        served.path().to_path_buf(),
        rate,
        stats.clone(),
    ));
    Env {
        rt,
        served,
        cache_dir: tempfile::tempdir().unwrap(),
        url,
        stats,
    }
}

/// Deterministic pseudo-random bytes.
fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

impl Env {
    /// Publishes `bytes` as a layer blob into the served directory; returns its digest.
    fn publish(&self, bytes: &[u8], chunk: u64) -> String {
        let f = self.cache_dir.path().join("src.bin");
        std::fs::write(&f, bytes).unwrap();
        let local = LocalStore::new(self.served.path());
        let t = self.rt.block_on(publish_layer(&local, &f, chunk)).unwrap();
        std::fs::remove_file(&f).unwrap();
        t.digest
    }

    fn cache(&self, mode: Mode, limit: u64) -> Arc<LayerCache> {
        self.cache_with(&self.url.clone(), mode, limit)
    }

    fn cache_with(&self, url: &str, mode: Mode, limit: u64) -> Arc<LayerCache> {
        LayerCache::open(
            CacheConfig {
                dir: self.cache_dir.path().join("cache"),
                limit_bytes: limit,
                mode,
                prefetch: false,
            },
            open_store(url).unwrap(),
            self.rt.handle().clone(),
        )
        .unwrap()
    }

    fn served_blob(&self, digest: &str) -> PathBuf {
        self.served.path().join(blob_key(hex_of(digest).unwrap()))
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn lazy_range_read_equals_source_and_fetches_only_what_is_read() {
    let e = env(0);
    let src = data(5 << 20, 1);
    let digest = e.publish(&src, 256 * 1024);
    let hex = hex_of(&digest).unwrap().to_string();
    let cache = e.cache(Mode::Lazy, 1 << 30);
    cache.prepare(&digest).unwrap();
    for (off, len) in [
        (0u64, 10u32),
        (300_000, 70_000),
        (1_048_570, 20),
        (5_242_000, 4096),
    ] {
        let got = cache.read(&hex, off, len).unwrap();
        let end = ((off + len as u64) as usize).min(src.len());
        assert_eq!(got, src[off as usize..end], "range {off}+{len}");
    }
    let s = cache.stats();
    // Chunks 0, 1, 3 and 4 (0..1.25 MiB) and the last one: far less than the layer.
    assert!(s.fetched_bytes < 2 << 20, "{s:?}");
    assert!(cache.local_path(&digest).is_none());
    // Reading everything completes the layer: verified and made a plain local file.
    let all = cache.read(&hex, 0, src.len() as u32).unwrap();
    assert_eq!(all, src);
    let p = cache.local_path(&digest).expect("complete layer is local");
    assert_eq!(std::fs::read(p).unwrap(), src);
}

#[test]
fn concurrent_readers_of_one_chunk_cause_one_fetch() {
    // A slow server (4 MB/s) keeps the first fetch in flight while the others arrive.
    let e = env(4_000_000);
    let src = data(2 << 20, 2);
    let digest = e.publish(&src, 1 << 20);
    let hex = hex_of(&digest).unwrap().to_string();
    let cache = e.cache(Mode::Lazy, 1 << 30);
    cache.prepare(&digest).unwrap();
    let before = e.stats.range_requests.load(Ordering::SeqCst);
    std::thread::scope(|s| {
        for k in 0..16u64 {
            let cache = &cache;
            let hex = &hex;
            let src = &src;
            s.spawn(move || {
                let off = 1000 + k * 4096;
                let got = cache.read(hex, off, 4096).unwrap();
                assert_eq!(got, src[off as usize..off as usize + 4096]);
            });
        }
    });
    assert_eq!(cache.stats().fetches, 1);
    assert_eq!(e.stats.range_requests.load(Ordering::SeqCst) - before, 1);
}

#[test]
fn eviction_of_a_pinned_layer_is_refused_and_lru_evicts_unpinned_layers() {
    let e = env(0);
    let a = e.publish(&data(1 << 20, 3), 256 * 1024);
    let b = e.publish(&data(1 << 20, 4), 256 * 1024);
    let c = e.publish(&data(1 << 20, 5), 256 * 1024);
    // Room for two whole layers.
    let cache = e.cache(Mode::Eager, (2 << 20) + 1);
    cache.prepare(&a).unwrap();
    cache.pin(&a);
    assert!(matches!(cache.evict(&a), Err(BlobError::InUse(_))));
    cache.prepare(&b).unwrap();
    // c pushes the cache over its limit: b (unpinned, least recently used) goes, a stays.
    cache.prepare(&c).unwrap();
    assert!(cache.local_path(&a).is_some());
    assert!(cache.local_path(&b).is_none());
    assert!(cache.local_path(&c).is_some());
    assert_eq!(cache.stats().evictions, 1);
    cache.unpin(&a);
    cache.evict(&a).unwrap();
    assert!(cache.local_path(&a).is_none());
    assert!(matches!(cache.evict(&a), Err(BlobError::NotCached(_))));
}

#[test]
fn corrupt_and_truncated_blobs_are_detected_and_never_served() {
    let e = env(0);
    let src = data(2 << 20, 6);
    let digest = e.publish(&src, 256 * 1024);
    let hex = hex_of(&digest).unwrap().to_string();
    let cache = e.cache(Mode::Lazy, 1 << 30);
    cache.prepare(&digest).unwrap();
    // Flip one byte of chunk 2 on the server.
    let blob = e.served_blob(&digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[600_000] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let err = cache.read(&hex, 600_000, 10).unwrap_err();
    assert!(matches!(err, BlobError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("chunk 2"), "{err}");
    assert_eq!(cache.stats().corrupt_chunks, 1);
    // Untouched chunks still read fine; the bad one keeps failing (never cached).
    assert_eq!(cache.read(&hex, 0, 100).unwrap(), src[..100]);
    assert!(cache.read(&hex, 600_000, 10).is_err());
    // Truncated on the server: the last chunk comes back short.
    std::fs::write(&blob, &src[..src.len() - 1000]).unwrap();
    let err = cache.read(&hex, src.len() as u64 - 10, 10).unwrap_err();
    assert!(matches!(err, BlobError::Corrupt { .. }), "{err}");
    // Eager mode: the whole-blob digest refuses it, and nothing is left in the cache.
    std::fs::write(&blob, &bytes).unwrap();
    let eager = LayerCache::open(
        CacheConfig {
            dir: e.cache_dir.path().join("eager"),
            limit_bytes: 1 << 30,
            mode: Mode::Eager,
            prefetch: false,
        },
        open_store(&e.url).unwrap(),
        e.rt.handle().clone(),
    )
    .unwrap();
    let err = eager.prepare(&digest).unwrap_err();
    assert!(matches!(err, BlobError::Corrupt { .. }), "{err}");
    assert!(eager.local_path(&digest).is_none());
    let left: Vec<_> = std::fs::read_dir(e.cache_dir.path().join("eager/layers"))
        .unwrap()
        .flatten()
        .map(|d| d.file_name())
        .filter(|n| !n.to_string_lossy().ends_with(".chunks"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn unreachable_store_fails_prepare_with_a_clear_error() {
    let e = env(0);
    // A port nobody listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let cache = e.cache_with(&url, Mode::Lazy, 1 << 30);
    let t = std::time::Instant::now();
    let err = cache
        .prepare(&format!("sha256:{}", "ab".repeat(32)))
        .unwrap_err();
    assert!(matches!(err, BlobError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    // An unknown layer on a reachable store is NotFound.
    let cache = e.cache(Mode::Lazy, 1 << 30);
    let err = cache
        .prepare(&format!("sha256:{}", "cd".repeat(32)))
        .unwrap_err();
    assert!(matches!(err, BlobError::NotFound(_)), "{err}");
}

fn mkfs(dir: &Path, out: &Path) -> bool {
    std::process::Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg("-T0")
        .arg(out)
        .arg(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn erofs_mounted_from_the_lazy_fuse_file_reads_correctly() {
    if !is_root() {
        skip("needs root (FUSE and EROFS mounts)");
        return;
    }
    let e = env(0);
    let tree = e.cache_dir.path().join("tree");
    std::fs::create_dir_all(tree.join("d")).unwrap();
    let big = data(3 << 20, 7);
    std::fs::write(tree.join("d/big.bin"), &big).unwrap();
    for i in 0..50 {
        std::fs::write(tree.join(format!("d/small-{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let img = e.cache_dir.path().join("layer.erofs");
    if !mkfs(&tree, &img) {
        skip("mkfs.erofs missing (install erofs-utils)");
        return;
    }
    let local = LocalStore::new(e.served.path());
    let t =
        e.rt.block_on(publish_layer(&local, &img, 256 * 1024))
            .unwrap();
    let cache = e.cache(Mode::Lazy, 1 << 30);
    let source = CacheSource::new(cache.clone(), e.rt.handle().clone()).unwrap();
    assert!(source.prepare(&t.digest).unwrap());
    let file = source.mount_source(&t.digest).unwrap();
    assert!(file.starts_with(e.cache_dir.path().join("cache/lazy")));
    let mnt = e.cache_dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    warren_sys::mount::mount_erofs_file(&file, &mnt).unwrap();
    let check = || {
        assert_eq!(
            std::fs::read_to_string(mnt.join("d/small-7.txt")).unwrap(),
            "file 7\n"
        );
        assert_eq!(std::fs::read(mnt.join("d/big.bin")).unwrap(), big);
        // Everything was read: the layer is fully local, and new mounts use the plain file.
        let all = std::fs::metadata(&file).unwrap().len();
        let mut f = std::fs::File::open(&file).unwrap();
        std::io::copy(&mut f, &mut std::io::sink()).unwrap();
        assert_eq!(cache.stats().fetched_bytes, all);
        let fast = source.mount_source(&t.digest).unwrap();
        assert_eq!(
            fast,
            e.cache_dir
                .path()
                .join("cache/layers")
                .join(hex_of(&t.digest).unwrap())
        );
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
    warren_sys::mount::umount(&mnt, true).unwrap();
    drop(source);
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn corrupt_chunk_is_an_io_error_through_fuse() {
    if !is_root() {
        skip("needs root (FUSE mount)");
        return;
    }
    let e = env(0);
    let src = data(1 << 20, 8);
    let digest = e.publish(&src, 256 * 1024);
    let blob = e.served_blob(&digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&blob, &bytes).unwrap();
    let cache = e.cache(Mode::Lazy, 1 << 30);
    let source = CacheSource::new(cache, e.rt.handle().clone()).unwrap();
    assert!(source.prepare(&digest).unwrap());
    let file = source.mount_source(&digest).unwrap();
    let err = std::fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(5), "{err}");
}

#[test]
fn s3_backend_round_trip() {
    let moto = Path::new("/opt/warren-moto/bin/moto_server");
    if !moto.exists() {
        skip(format!(
            "{} missing (scripts/setup.sh installs moto[server])",
            moto.display()
        ));
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = std::process::Command::new(moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut up = false;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let r = std::panic::catch_unwind(|| {
        assert!(up, "moto did not start");
        // Make the bucket with a plain S3 PUT (moto accepts any credentials).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let c = reqwest_put(&rt, &format!("{endpoint}/layers"));
        assert!(c, "create bucket");
        std::env::set_var("AWS_ENDPOINT_URL", &endpoint);
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
        let store = open_store("s3://layers/node-cache").unwrap();
        let src = data(3 << 20, 9);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("b");
        std::fs::write(&f, &src).unwrap();
        let t = rt
            .block_on(publish_layer(store.as_ref(), &f, 512 * 1024))
            .unwrap();
        let hex = hex_of(&t.digest).unwrap().to_string();
        assert_eq!(
            rt.block_on(store.head(&blob_key(&hex))).unwrap(),
            src.len() as u64
        );
        let r = rt
            .block_on(store.get_range(&blob_key(&hex), 1000..5000))
            .unwrap();
        assert_eq!(&r[..], &src[1000..5000]);
        let cache = LayerCache::open(
            CacheConfig {
                dir: dir.path().join("cache"),
                limit_bytes: 1 << 30,
                mode: Mode::Lazy,
                prefetch: false,
            },
            store,
            rt.handle().clone(),
        )
        .unwrap();
        cache.prepare(&t.digest).unwrap();
        assert_eq!(
            cache.read(&hex, 2_000_000, 1000).unwrap(),
            src[2_000_000..2_001_000]
        );
        shipped_trajectory_in_s3(&rt);
        file_by_parts_in_s3(&rt);
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

/// A file of two parts and a tail is stored in S3 by a multipart upload, whole; an aborted
/// upload leaves no object.
fn file_by_parts_in_s3(rt: &tokio::runtime::Runtime) {
    let store = open_store("s3://layers/parts-test").unwrap();
    let src = data(2 * warren_blob::PART_BYTES + 4321, 3);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("big");
    std::fs::write(&f, &src).unwrap();
    let n = rt
        .block_on(warren_blob::put_file(
            store.as_ref(),
            "outputs/big",
            std::fs::File::open(&f).unwrap(),
        ))
        .unwrap();
    assert_eq!(n, src.len() as u64);
    assert_eq!(
        rt.block_on(store.head("outputs/big")).unwrap(),
        src.len() as u64
    );
    assert!(rt.block_on(store.get("outputs/big")).unwrap() == src);
    rt.block_on(async {
        let mut u = store.put_parts("outputs/aborted").await.unwrap();
        u.put_part(bytes::Bytes::from(data(warren_blob::PART_BYTES, 4)))
            .await
            .unwrap();
        u.abort().await.unwrap();
    });
    assert!(matches!(
        rt.block_on(store.head("outputs/aborted")),
        Err(BlobError::NotFound(_))
    ));
}

/// A trajectory shipped to S3 (segments listed under the store's prefix, one sent twice)
/// reads back whole, once per seq.
fn shipped_trajectory_in_s3(rt: &tokio::runtime::Runtime) {
    use warren_blob::trajectory as shipped;
    let store = shipped::open_trajectory_store("s3://layers/trajectories-test").unwrap();
    let id: warren_types::SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
    let line = |seq: u64| {
        let entry = warren_types::TrajectoryEntry {
            seq,
            step: Some(seq),
            call: warren_types::TrajectoryCall::Kill { pid: 1, signal: 9 },
            request_sha256: "ab".into(),
            started_at_ms: 1,
            ended_at_ms: 2,
            duration_ms: 1.0,
            result: None,
            error: None,
            cancelled: false,
        };
        shipped::SegmentLine {
            entry,
            stdout_blob: None,
            stderr_blob: None,
            stored: None,
        }
    };
    for (a, b) in [(1, 3), (4, 5), (1, 3)] {
        let header = shipped::SegmentHeader {
            format: shipped::FORMAT,
            sandbox: id.to_string(),
            tenant: Some("t".into()),
            first_seq: a,
            last_seq: b,
        };
        let lines: Vec<_> = (a..=b).map(line).collect();
        rt.block_on(store.put(
            &shipped::segment_key(&id, a, b),
            shipped::encode_segment(&header, &lines),
        ))
        .unwrap();
    }
    assert_eq!(
        rt.block_on(shipped::last_shipped(store.as_ref(), &id))
            .unwrap(),
        5
    );
    let all = rt
        .block_on(async {
            shipped::TrajectoryPages::open(store.clone(), &id, 2, &warren_types::Caller::admin())
                .await?
                .all()
                .await
        })
        .unwrap();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3, 4, 5]);
}

fn reqwest_put(rt: &tokio::runtime::Runtime, url: &str) -> bool {
    rt.block_on(async {
        // A raw HTTP/1.1 PUT: moto's bucket creation needs no signature.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let u = url.strip_prefix("http://").unwrap();
        let (host, path) = u.split_once('/').unwrap();
        let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
        let req = format!("PUT /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200")
    })
}
