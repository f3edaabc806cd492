//! microVMs through a real daemon: the API's view of a VM's life — create, exec, a daemon
//! restart (the VM is re-adopted), the VMM killed (the sandbox turns `failed`, saying how
//! QEMU ended), delete
//! (nothing left: no QEMU, no disk overlay, no socket, no cgroup). Skips, saying why, when the
//! daemon does not serve microvm (no QEMU or guest kernel on this host).

#[path = "../common/mod.rs"]
mod common;
mod fork;
mod memory;
mod ports;
mod snapshots;

use std::path::PathBuf;
use std::time::Duration;

use common::{wait_for, Daemon};
use warren_client::{CreateSandboxRequest, SandboxState, Substrate};

/// Pid of the QEMU serving sandbox `id` (its sockets live in a directory named after it).
pub(crate) fn qemu_of(id: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        (cmd.contains("qemu-system") && cmd.contains(&format!("/{id}/"))).then_some(pid)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_survives_a_restart_fails_when_its_vmm_dies_and_leaves_nothing() {
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    let served = d.client().health().await.unwrap().substrates;
    if !served.iter().any(|s| s == "microvm") {
        common::skip(format!(
            "the daemon does not serve microvm; its log says:\n{}",
            d.log_tail(20)
        ));
        return;
    }
    let req = CreateSandboxRequest {
        substrate: Substrate::Microvm,
        memory_mb: Some(256),
        hostname: Some("vmbox".into()),
        ..Default::default()
    };
    let a = d.create(&req).await;
    let b = d.create(&req).await;
    assert_eq!(a.substrate, Substrate::Microvm);
    // Both starts were measured phase by phase.
    let text = d.client().metrics().await.unwrap();
    for phase in ["cgroups", "image", "agent", "network", "record"] {
        let line = format!(
            "warren_sandbox_create_phase_seconds_count{{substrate=\"microvm\",phase=\"{phase}\"}} 2\n"
        );
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
    assert_eq!(
        d.sh_ok(&a.id, "hostname; echo kept > /root/f").await.trim(),
        "vmbox"
    );
    let dir_of = |id: &str| -> PathBuf { d.state_dir.join("vm/sandboxes").join(&d.node).join(id) };
    let (dir_a, dir_b) = (dir_of(&a.id), dir_of(&b.id));
    assert!(dir_a.join("agent.sock").exists() && dir_a.join("disk.qcow2").exists());

    // A daemon away for a while, then restarted, re-adopts the running VM: its files and
    // QEMU are the same, and the guest's agent waited without growing.
    let qemu_a = qemu_of(&a.id).expect("QEMU of a");
    let rss = |s: String| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let before = rss(d.sh_ok(&a.id, "cat /proc/1/status").await);
    assert!(d.stop().await.success());
    tokio::time::sleep(Duration::from_secs(5)).await;
    d.spawn().await;
    assert_eq!(d.sh_ok(&a.id, "cat /root/f").await.trim(), "kept");
    assert_eq!(qemu_of(&a.id), Some(qemu_a));
    let after = rss(d.sh_ok(&a.id, "cat /proc/1/status").await);
    assert!(
        after < before + 8 * 1024,
        "the guest agent grew from {before} to {after} KiB while the daemon was away"
    );

    // The VMMs die: the sandboxes are reported failed, saying how QEMU ended. One started by
    // this daemon (its exit status is known) and one adopted from the earlier run (not its
    // child: only that it exited).
    let c = d.create(&req).await;
    let dir_c = d.state_dir.join("vm/sandboxes").join(&d.node).join(&c.id);
    for (id, adopted) in [(&c.id, false), (&b.id, true)] {
        let qemu = qemu_of(id).expect("QEMU of the sandbox");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(qemu as i32),
            nix::sys::signal::SIGKILL,
        )
        .unwrap();
        let failed = wait_for(Duration::from_secs(20), || async {
            let s = d.client().get(id).await.ok()?;
            (s.state == SandboxState::Failed).then_some(s)
        })
        .await
        .expect("a sandbox whose VMM died turns failed");
        let reason = failed.reason.unwrap_or_default();
        assert!(
            reason.contains(&format!("QEMU (pid {qemu})")),
            "reason: {reason}"
        );
        if !adopted {
            assert!(
                reason.contains("killed by signal 9 (SIGKILL)"),
                "reason: {reason}"
            );
        }
    }

    // Delete leaves nothing of any.
    for (id, dir) in [(&a.id, &dir_a), (&b.id, &dir_b), (&c.id, &dir_c)] {
        d.client().delete(id).await.unwrap();
        assert_eq!(qemu_of(id), None, "QEMU of {id} still runs");
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(d.cgroup_dirs(id).is_empty(), "cgroups of {id} left behind");
    }
}
