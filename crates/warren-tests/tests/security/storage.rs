//! The node's disk and memory against what a sandbox prints and what is copied into it: the
//! trajectory keeps output within the sandbox's budget, an export streams in bounded memory,
//! and an upload that cannot fit is refused up front and never leaves a partial file.

use base64::Engine as _;
use sha2::Digest as _;
use std::time::Duration;

use warren_client::{CreateSandboxRequest, ErrorCode, ExecRequest, OutputEncoding};

use crate::common::raw_request;
use crate::Scene;

fn state_file(s: &Scene) -> std::path::PathBuf {
    s.d.state_dir.join("state.redb")
}

fn file_len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// An exec printing `n` bytes of distinct random data (so no two outputs share a blob).
fn random_output(n: usize) -> ExecRequest {
    let mut req = ExecRequest::shell(format!("head -c {n} /dev/urandom"));
    req.encoding = OutputEncoding::Base64;
    req.max_output_bytes = Some(n as u64);
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_trajectory_budget_is_kept_as_digests_only() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        trajectory_mb: Some(8),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let before = file_len(&state_file(&s));
    let mut digests = Vec::new();
    for _ in 0..40 {
        let r = s.d.exec(&s.a, &random_output(1_000_000)).await;
        // The caller always gets the whole output; only what is kept in the log is bounded.
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&r.stdout)
            .unwrap();
        assert_eq!(bytes.len(), 1_000_000);
        digests.push(hex::encode(sha2::Sha256::digest(&bytes)));
    }
    let grown = file_len(&state_file(&s)).saturating_sub(before);
    assert!(
        grown < 20 << 20,
        "40 MB of output with an 8 MiB budget grew the state file by {grown} bytes"
    );
    let entries = s.d.client().trajectory(&s.a, None).await.unwrap();
    let execs: Vec<_> = entries
        .iter()
        .filter_map(|e| match &e.result {
            Some(warren_types::TrajectoryResult::Exec(o)) => Some(o),
            _ => None,
        })
        .collect();
    assert_eq!(execs.len(), 40);
    let kept = execs.iter().filter(|o| !o.stdout_omitted).count();
    assert!(
        (4..=8).contains(&kept),
        "{kept} outputs of 1 MB kept under an 8 MiB budget"
    );
    for (o, d) in execs.iter().zip(&digests) {
        assert_eq!(&o.stdout_sha256, d, "the digest of an output is wrong");
        assert_eq!(o.result.stdout_bytes, 1_000_000);
        if o.stdout_omitted {
            assert!(o.result.stdout.is_empty());
        }
    }
    // The node reports its state size.
    let (status, _, body) = raw_request(&s.d.socket, "GET", "/v1/health", None, "").await;
    assert_eq!(status, 200);
    let h: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(h["state"]["bytes"].as_u64().unwrap() > 0, "{h}");
    assert!(h["state"]["max_bytes"].as_u64().unwrap() > 0, "{h}");
    let metrics = s.d.client().metrics().await.unwrap();
    assert!(metrics.contains("\nwarren_state_bytes "), "{metrics}");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_state_limit_stops_keeping_output_for_every_sandbox() {
    // A node whose state file is already at its limit keeps no output, whatever the budget.
    let Some(d) =
        crate::common::Daemon::start_with(|_| vec!["--state-max-mb".into(), "0".into()]).await
    else {
        return;
    };
    let id = d.sandbox().await;
    let r = d.exec(&id, &random_output(200_000)).await;
    assert_eq!(r.stdout_bytes, 200_000);
    let entries = d.client().trajectory(&id, None).await.unwrap();
    let Some(warren_types::TrajectoryResult::Exec(o)) = &entries.last().unwrap().result else {
        panic!("no exec entry: {entries:?}");
    };
    assert!(o.stdout_omitted, "output kept past the node's state limit");
    let (_, _, body) = raw_request(&d.socket, "GET", "/v1/health", None, "").await;
    let h: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(h["state"]["full"], true, "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_exports_of_a_large_trajectory_stream_in_bounded_memory() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        trajectory_mb: Some(128),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    // About 100 MB of distinct output in the log.
    for _ in 0..50 {
        s.d.exec(&s.a, &random_output(2_000_000)).await;
    }
    let pid = s.d.pid().expect("daemon pid");
    let base = rss_kib(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(base));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut exports = Vec::new();
    for _ in 0..5 {
        let (sock, path) = (
            s.d.socket.clone(),
            format!("/v1/sandboxes/{}/trajectory", s.a),
        );
        exports.push(tokio::spawn(async move {
            let (status, _, body) = raw_request(&sock, "GET", &path, None, "").await;
            assert_eq!(status, 200);
            (body.len(), body.iter().filter(|b| **b == b'\n').count())
        }));
    }
    for e in exports {
        let (len, lines) = e.await.unwrap();
        assert!(lines >= 50, "{lines} lines");
        assert!(len > 100_000_000, "the export holds {len} bytes");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    let grew_mib = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(base)
        >> 10;
    assert!(
        grew_mib < 128,
        "5 exports of a 130 MB trajectory grew the daemon by {grew_mib} MiB"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_cannot_fit_is_refused_up_front_and_leaves_no_partial_file() {
    // In memory: the agent sees the layer's free space in statfs (a quota on disk is not in
    // it; there an upload that does not fit fails when the quota stops it).
    let Some(s) = Scene::with(CreateSandboxRequest {
        disk_mb: Some(32),
        disk_medium: Some(warren_types::DiskMedium::Memory),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let c = s.d.client();
    s.sh_ok_stdout("mkdir -p /up && echo old > /up/f && head -c 20000000 /dev/zero > /fill")
        .await;
    let zeros = |n: usize| {
        futures::stream::iter((0..n.div_ceil(1 << 20)).map(move |i| {
            Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; (n - (i << 20)).min(1 << 20)]))
        }))
    };
    // Larger than the whole writable layer: refused by the API.
    let e = c
        .write_file_sized(&s.a, "/up/f", None, Some(40 << 20), zeros(40 << 20))
        .await
        .expect_err("a 40 MiB upload into a 32 MiB layer was accepted");
    assert_eq!(e.code(), Some(ErrorCode::LimitExceeded), "{e}");
    // Fits the layer but not its free space: refused by the agent before a byte is written.
    let e = c
        .write_file_sized(&s.a, "/up/f", None, Some(16 << 20), zeros(16 << 20))
        .await
        .expect_err("an upload larger than the free space was accepted");
    assert_eq!(e.code(), Some(ErrorCode::FileError), "{e}");
    // Without a size it streams until the layer is full, then fails: nothing is left.
    let e = c
        .write_file(&s.a, "/up/f", None, zeros(16 << 20))
        .await
        .expect_err("an upload larger than the free space was written");
    assert!(e.code().is_some(), "{e}");
    // A body shorter than announced fails the same way.
    let e = c
        .write_file_sized(&s.a, "/up/f", None, Some(1000), zeros(10))
        .await
        .expect_err("a short upload was accepted");
    assert!(e.code().is_some(), "{e}");
    let ls = s.sh_ok_stdout("ls -A /up; cat /up/f").await;
    assert_eq!(ls, "f\nold\n", "an upload left something behind");
    // The space is all there again, and a good upload still replaces the file.
    c.write_file_sized(&s.a, "/up/f", None, Some(10 << 20), zeros(10 << 20))
        .await
        .expect("an upload that fits failed");
    assert_eq!(
        s.sh_ok_stdout("stat -c %s /up/f; ls -A /up").await,
        "10485760\nf\n"
    );
    s.assert_unaffected().await;
}
