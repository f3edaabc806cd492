//! Host memory of microVMs: restored VMs share the template's guest memory through the page
//! cache (copy-on-write), and pause pushes a VM's memory out of RAM and resume continues it.

use crate::common::{self, Daemon};
use crate::qemu_of;
use warren_client::{CreateSandboxRequest, ExecRequest, Substrate};

fn request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        substrate: Substrate::Microvm,
        memory_mb: Some(256),
        ..Default::default()
    }
}

/// Resident KiB of the guest RAM mapping of a QEMU (the template's file `.../ram`): shared
/// with other processes, and private (pages this guest wrote).
fn guest_ram_kib(pid: u32) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps of QEMU");
    let (mut shared, mut private, mut inside) = (0, 0, false);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = line.trim_end().ends_with("/ram");
            continue;
        }
        if !inside {
            continue;
        }
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        match first {
            "Shared_Clean:" | "Shared_Dirty:" => shared += kib,
            "Private_Clean:" | "Private_Dirty:" => private += kib,
            _ => {}
        }
    }
    (shared, private)
}

pub(crate) async fn daemon_with_microvm() -> Option<Daemon> {
    let d = Daemon::start().await?;
    let served = d.client().health().await.unwrap().substrates;
    if !served.iter().any(|s| s == "microvm") {
        common::skip(format!(
            "the daemon does not serve microvm; its log says:\n{}",
            d.log_tail(20)
        ));
        return None;
    }
    Some(d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_microvms_share_the_templates_guest_memory() {
    let Some(d) = daemon_with_microvm().await else {
        return;
    };
    let a = d.create(&request()).await;
    let b = d.create(&request()).await;
    for id in [&a.id, &b.id] {
        assert_eq!(d.sh_ok(id, "echo up").await.trim(), "up");
    }
    // Each guest writes its own page: copy-on-write keeps them apart.
    d.sh_ok(&a.id, "echo a > /dev/shm/who").await;
    d.sh_ok(&b.id, "echo b > /dev/shm/who").await;
    assert_eq!(d.sh_ok(&a.id, "cat /dev/shm/who").await.trim(), "a");
    assert_eq!(d.sh_ok(&b.id, "cat /dev/shm/who").await.trim(), "b");
    for id in [&a.id, &b.id] {
        let pid = qemu_of(id).expect("QEMU of the sandbox");
        let cmd = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
            .replace('\0', " ");
        assert!(
            cmd.contains("share=off,readonly=on,rom=off"),
            "not a private mapping of the template: {cmd}"
        );
        let (shared, private) = guest_ram_kib(pid);
        eprintln!("{id}: guest RAM resident {shared} KiB shared, {private} KiB private");
        // Most of what the guest uses is the template's page cache, shared with the other
        // VM; only what it wrote since its restore is its own.
        assert!(
            shared > 2 * private && shared > 4096,
            "guest RAM of {id} is not shared: {shared} KiB shared, {private} KiB private"
        );
    }
    // The template's memory file is never written by the VMs restored from it.
    let templates = d.state_dir.join("vm/templates");
    let ram = std::fs::read_dir(&templates)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("ram"))
        .find(|p| p.is_file())
        .expect("a template with a ram file");
    let before = std::fs::metadata(&ram).unwrap().modified().unwrap();
    d.sh_ok(&a.id, "head -c 1000000 /dev/urandom > /dev/shm/noise")
        .await;
    assert_eq!(std::fs::metadata(&ram).unwrap().modified().unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_pause_pushes_memory_out_and_resume_continues() {
    let Some(d) = daemon_with_microvm().await else {
        return;
    };
    let c = d.client();
    let sb = d.create(&request()).await;
    let id = &sb.id;
    let sum = d
        .sh_ok(
            id,
            "head -c 64000000 /dev/urandom > /root/data && sha256sum /root/data",
        )
        .await;
    c.spawn(
        id,
        &ExecRequest::shell("i=0; while :; do i=$((i+1)); echo $i > /run/c.tmp; mv /run/c.tmp /run/count; sleep 0.05; done"),
    )
    .await
    .expect("starting the counter");
    // The count is replaced whole (rename), so a read never sees it half written.
    d.sh_ok(id, "while [ ! -s /run/count ]; do sleep 0.05; done")
        .await;
    let count = || async {
        let s = d.sh_ok(id, "cat /run/count").await;
        s.trim().parse::<u64>().expect("a count")
    };
    let mut last = count().await;
    for cycle in 0..20 {
        let stats = c.pause(id).await.expect("pause");
        assert!(
            stats.memory_after_bytes < stats.memory_before_bytes,
            "cycle {cycle}: memory did not go down: {stats:?}"
        );
        c.resume(id).await.expect("resume");
        // The counter goes on: a guest under TCG on a busy host may take a while to tick
        // again after its memory was paged out, so it is polled (bounded), not timed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let now = loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let now = count().await;
            if now > last || std::time::Instant::now() > deadline {
                break now;
            }
        };
        assert!(now > last, "cycle {cycle}: the counter stopped at {last}");
        last = now;
    }
    assert_eq!(d.sh_ok(id, "sha256sum /root/data").await, sum);
    c.delete(id).await.unwrap();
}
