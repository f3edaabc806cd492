//! `GET /v1/sandboxes/{id}/stats` and `warren stats`: what a sandbox uses, read from outside.

use warren_client::{CreateSandboxRequest, SandboxState};

use crate::common::{warren_at, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_cpu_memory_disk_and_pids_against_the_limits() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(128),
            disk_mb: Some(64),
            cpus: Some(1.0),
            // In memory: the layer's bytes show in the memory figure too (checked below).
            disk_medium: Some(warren_types::DiskMedium::Memory),
            ..Default::default()
        })
        .await
        .id;
    let c = d.client();
    let idle = c.stats(&id).await.unwrap();
    assert_eq!(idle.id, id);
    assert_eq!(idle.state, SandboxState::Running);
    assert_eq!(
        (idle.memory_limit_bytes, idle.disk_limit_bytes, idle.cpus),
        (128 << 20, 64 << 20, 1.0)
    );
    let before_disk = idle
        .disk_bytes
        .expect("a container's writable layer is measured");
    // 16 MiB into the writable layer and a second of busy CPU.
    d.sh_ok(
        &id,
        "head -c 16777216 /dev/zero > /root/f; timeout 1 sh -c 'while :; do :; done'; echo ok",
    )
    .await;
    let busy = c.stats(&id).await.unwrap();
    let disk = busy.disk_bytes.unwrap();
    // The memory cgroup's statistics are flushed in per-CPU batches (up to 64 pages per CPU
    // may be pending), so the figure can trail what was written by a little.
    let pending = 64 * 4096 * std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    assert!(
        disk + pending >= before_disk + (16 << 20),
        "16 MiB written, disk in use {before_disk} -> {disk}"
    );
    let (share, window) = (busy.cpu_share.unwrap(), busy.window_secs.unwrap());
    assert!(
        share > 0.05 && window >= 0.9,
        "a busy second shows as CPU: {share} over {window} s"
    );
    assert!(busy.cpu_usec.unwrap() > idle.cpu_usec.unwrap());
    assert!(
        busy.memory_bytes.unwrap() >= disk,
        "the layer is charged to memory"
    );
    assert!(busy
        .memory_peak_bytes
        .is_none_or(|p| p >= busy.memory_bytes.unwrap()));
    assert!(busy.pids.unwrap() >= 1 && busy.pids_limit > 0);
    assert!(busy.trajectory_bytes > idle.trajectory_bytes);
    // Reading stats is no call: a paused sandbox stays paused, and idle time keeps counting.
    c.pause(&id).await.unwrap();
    let paused = c.stats(&id).await.unwrap();
    assert_eq!(paused.state, SandboxState::Paused);
    assert_eq!(c.get(&id).await.unwrap().state, SandboxState::Paused);
    // Unknown sandboxes are 404s.
    let missing = format!("{}-01jd0m7x4e8k0k9yq1w2e3r4t5", d.node);
    let e = c.stats(&missing).await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    // The CLI prints the same figures once when stdout is not a terminal.
    let url = format!("unix://{}", d.socket.display());
    let out = warren_at(&url, &["stats", &id]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&id) && text.contains("paused") && text.contains("128.0MiB"),
        "{text}"
    );
    let out = warren_at(&url, &["stats", "--json", &id]);
    let parsed: Vec<warren_client::SandboxStats> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(parsed[0].id, id);
    let out = warren_at(&url, &["stats"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
}
