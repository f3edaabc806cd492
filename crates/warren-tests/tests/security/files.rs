//! File-API path escapes: `..`, symlinks to host paths, NUL, over-long names and paths, via
//! upload, download, list, stat, remove and chmod; uploads larger than the disk limit.

use warren_client::ErrorCode;

use crate::Scene;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotdot_paths_stay_inside_the_sandbox() {
    let Some(s) = Scene::new().await else { return };
    let c = s.d.client();
    let host_file = std::env::temp_dir().join(format!("warren-sec-dotdot-{}", s.d.node));
    let _ = std::fs::remove_file(&host_file);
    // A path that climbs above the root is refused as such...
    let escaped = format!("/../../..{}", host_file.display());
    let e = c
        .write_file_bytes(&s.a, &escaped, None, "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    for r in [
        c.read_file_bytes(&s.a, "/../etc/passwd").await.map(|_| ()),
        c.stat(&s.a, "/tmp/../../etc").await.map(|_| ()),
        c.list_dir(&s.a, "/..").await.map(|_| ()),
        c.remove(&s.a, "/../tmp", true).await,
        c.chmod(&s.a, "/../../bin/sh", 0o777).await,
    ] {
        assert_eq!(r.unwrap_err().code(), Some(ErrorCode::InvalidPath));
    }
    // ...and one that stays inside is normalised and lands in the sandbox.
    let inner = format!("/etc/..{}", host_file.display());
    c.write_file_bytes(&s.a, &inner, None, "from the sandbox")
        .await
        .unwrap();
    assert!(
        !host_file.exists(),
        "an upload with `..` wrote the host's {}",
        host_file.display()
    );
    let inside = s
        .sh_ok_stdout(&format!("cat {}", host_file.display()))
        .await;
    assert_eq!(inside, "from the sandbox");
    // Download of `/etc/../etc/hostname` reads the sandbox's file, not the host's.
    let got = c
        .read_file_bytes(&s.a, "/etc/../etc/hostname")
        .await
        .unwrap();
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert_eq!(String::from_utf8_lossy(&got).trim(), "sandbox");
    assert_ne!(
        String::from_utf8_lossy(&got),
        host,
        "the host's /etc/hostname was read"
    );
    // Relative paths are refused outright.
    for p in ["etc/passwd", "../etc/passwd", ""] {
        let e = c.stat(&s.a, p).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "stat {p:?}: {e}");
    }
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_to_host_paths_resolve_inside() {
    let Some(s) = Scene::new().await else { return };
    let c = s.d.client();
    let secret = std::env::temp_dir().join(format!("warren-sec-secret-{}", s.d.node));
    std::fs::write(&secret, "HOST SECRET").unwrap();
    let target = std::env::temp_dir().join(format!("warren-sec-target-{}", s.d.node));
    let _ = std::fs::remove_file(&target);
    s.sh_ok_stdout(&format!(
        "ln -s {} /tmp/secret && ln -s {} /tmp/target && ln -s / /tmp/root && \
         ln -s /proc/1/environ /tmp/agentenv && ln -s ../../../../.. /tmp/up",
        secret.display(),
        target.display()
    ))
    .await;
    // Reading through a link to a host path finds nothing (it resolves in the sandbox).
    let e = c.read_file_bytes(&s.a, "/tmp/secret").await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(ErrorCode::NotFound),
        "download via symlink: {e}"
    );
    let e = c
        .read_file_bytes(&s.a, "/tmp/up/tmp/secret")
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some(ErrorCode::NotFound),
        "download via ../ symlink: {e}"
    );
    // Writing through one creates the file inside.
    c.write_file_bytes(&s.a, "/tmp/target", None, "x")
        .await
        .unwrap();
    assert!(
        !target.exists(),
        "an upload through a symlink wrote the host's {}",
        target.display()
    );
    // Listing and stat through a link to / show the sandbox's root.
    let names: Vec<String> = c
        .list_dir(&s.a, "/tmp/root/")
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.contains("warren-tests") || n.ends_with("/work")),
        "the host's root is listed: {names:?}"
    );
    // chmod and remove act on the link or inside; the host file is untouched.
    let _ = c.chmod(&s.a, "/tmp/secret", 0o777).await;
    c.remove(&s.a, "/tmp/secret", false).await.unwrap();
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "HOST SECRET");
    let mode = std::fs::metadata(&secret).unwrap();
    assert_ne!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o777
    );
    // The agent's own environment is empty: nothing leaks through /proc/1/environ.
    if let Ok(env) = c.read_file_bytes(&s.a, "/tmp/agentenv").await {
        assert!(env.is_empty(), "the agent's environment leaked: {env:?}");
    }
    std::fs::remove_file(&secret).unwrap();
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_and_overlong_paths_get_typed_errors() {
    let Some(s) = Scene::new().await else { return };
    let c = s.d.client();
    let long_name = format!("/tmp/{}", "n".repeat(300));
    let long_path = format!("/tmp{}", "/d".repeat(3000));
    for p in ["/tmp/a\0b", "/\0", long_path.as_str()] {
        let e = c.stat(&s.a, p).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(ErrorCode::InvalidPath),
            "stat {:?}: {e}",
            &p[..p.len().min(20)]
        );
        let e = c.write_file_bytes(&s.a, p, None, "x").await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "upload: {e}");
        let e = c.read_file_bytes(&s.a, p).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "download: {e}");
        let e = c.list_dir(&s.a, p).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "list: {e}");
        let e = c.remove(&s.a, p, true).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "remove: {e}");
        let e = c.chmod(&s.a, p, 0o644).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "chmod: {e}");
    }
    // A name longer than any filesystem allows is refused at the edge, on every route.
    for r in [
        c.write_file_bytes(&s.a, &long_name, None, "x").await,
        c.stat(&s.a, &long_name).await.map(|_| ()),
        c.chmod(&s.a, &long_name, 0o600).await,
        c.remove(&s.a, &long_name, false).await,
        c.read_file_bytes(&s.a, &long_name).await.map(|_| ()),
    ] {
        let e = r.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "long name: {e}");
        assert!(
            e.to_string().contains("longer than 255"),
            "unclear error: {e}"
        );
    }
    // A name the filesystem refuses for its own reasons comes back as a file error.
    let e = c
        .write_file_bytes(&s.a, "/tmp", None, "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::FileError), "{e}");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_larger_than_the_disk_limit_are_refused() {
    let Some(s) = Scene::with(warren_client::CreateSandboxRequest {
        disk_mb: Some(8),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let c = s.d.client();
    // Announced too large: refused before anything is written.
    let e = c
        .write_file_bytes(&s.a, "/tmp/big", None, vec![0u8; 9 << 20])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::LimitExceeded), "{e}");
    assert!(e.to_string().contains("disk_mb"), "unclear error: {e}");
    // Streamed without a length: stops at the layer's limit with a file error.
    let chunks = futures::stream::iter(
        (0..12).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![1u8; 1 << 20]))),
    );
    let e = c
        .write_file(&s.a, "/tmp/big2", None, chunks)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::FileError), "{e}");
    assert!(e.to_string().contains("space"), "unclear error: {e}");
    s.sh_ok_stdout("rm -f /tmp/big /tmp/big2").await;
    s.assert_unaffected().await;
}
