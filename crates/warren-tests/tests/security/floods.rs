//! Floods: fork bomb, output, disk and memory. Each is stopped inside its sandbox; the host,
//! the daemon and a neighbour carry on.

use std::time::Duration;

use warren_client::{CreateSandboxRequest, ExecRequest};

use crate::Scene;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_hits_the_pid_limit() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        pids: Some(64),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let mut req = ExecRequest::argv(["bash", "-c", ":(){ :|:& };:; sleep 3"]);
    req.timeout_secs = Some(5.0);
    let client = s.d.client().clone();
    let a = s.a.clone();
    let bomb = tokio::spawn(async move { client.exec(&a, &req).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    // While it runs, the pid count is held at the limit...
    let cur: u64 =
        s.d.cgroup_dirs(&s.a)
            .iter()
            .find_map(|g| std::fs::read_to_string(g.join("pids.current")).ok())
            .and_then(|v| v.trim().parse().ok())
            .expect("pids.current");
    assert!(
        cur <= 64,
        "the bomb has {cur} processes under a limit of 64"
    );
    // ...and the neighbour answers.
    let r = tokio::time::timeout(Duration::from_secs(30), s.d.sh_ok(&s.b, "echo ok")).await;
    assert_eq!(r.expect("the neighbour did not answer").trim(), "ok");
    let _ = bomb.await;
    // Orphans of the bomb may keep forking against the limit; the cap still holds, the
    // rest of the node is unaffected, and deleting the sandbox ends it all.
    let cur: u64 =
        s.d.cgroup_dirs(&s.a)
            .iter()
            .find_map(|g| std::fs::read_to_string(g.join("pids.current")).ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
    assert!(cur <= 64, "{cur} processes under a limit of 64");
    s.assert_host_and_neighbour().await;
    s.d.client().delete(&s.a).await.unwrap();
    assert!(
        s.d.cgroup_dirs(&s.a).is_empty(),
        "the bombed sandbox keeps its cgroups"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_flood_is_capped() {
    let Some(s) = Scene::new().await else { return };
    let mut req = ExecRequest::shell("yes | head -c 200000000; echo done >&2");
    req.max_output_bytes = Some(1 << 20);
    req.timeout_secs = Some(60.0);
    let r = s.d.exec(&s.a, &req).await;
    assert_eq!(r.stdout.len(), 1 << 20, "kept output is not the cap");
    assert!(
        r.stdout_truncated,
        "the result does not say it was truncated"
    );
    assert_eq!(
        r.stdout_bytes, 200_000_000,
        "the flood was not counted in full"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_fill_stops_at_the_disk_limit() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        disk_mb: Some(16),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let host_free_before = host_free_bytes();
    let r = s
        .sh("dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; du -m /tmp/fill")
        .await;
    // ENOSPC in memory (a tmpfs), EDQUOT on disk (the layer's quota).
    assert!(
        r.stdout.contains("No space left on device") || r.stdout.contains("Disk quota exceeded"),
        "no ENOSPC or EDQUOT: {r:?}"
    );
    let used: u64 = r
        .stdout
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        used <= 16,
        "the sandbox wrote {used} MiB under a 16 MiB limit"
    );
    // The host's disk did not pay for it, and the neighbour can still write.
    let host_free_after = host_free_bytes();
    assert!(
        host_free_before.saturating_sub(host_free_after) < 256 << 20,
        "host free space fell by {} bytes",
        host_free_before - host_free_after
    );
    s.d.sh_ok(&s.b, "dd if=/dev/zero of=/tmp/ok bs=1M count=8 2>/dev/null")
        .await;
    // The sandbox recovers once it deletes the file.
    s.sh_ok_stdout("rm /tmp/fill && echo x > /tmp/after").await;
    s.assert_unaffected().await;
}

fn host_free_bytes() -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1", "/var/lib"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hog_is_killed_inside_its_sandbox() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        memory_mb: Some(96),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let mut req = ExecRequest::argv([
        "python3",
        "-c",
        "b=[]\nwhile True: b.append(bytearray(16*2**20))",
    ]);
    req.timeout_secs = Some(60.0);
    let r = s.d.exec(&s.a, &req).await;
    assert!(!r.timed_out, "the hog ran into the timeout: {r:?}");
    assert!(
        r.signal == Some(9) || r.stderr.contains("MemoryError"),
        "the hog was not stopped by the memory limit: {r:?}"
    );
    s.assert_unaffected().await;
}
